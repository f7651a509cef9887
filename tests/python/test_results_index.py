"""experiments/RESULTS.md indexes every study folder once, and every link it makes resolves.

Issue 40 found six study folders (chaos, checksum, fuzz, mutation, reduce_scatter_netbed, soak)
missing from the index and the small-bucket row listed twice, glued to other rows. A study
folder added without a row, a row left for a deleted folder, or a row repeated fails here.
"""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "RESULTS.md"
FOLDERS = ROOT / "experiments" / "results"


def _studies_table():
    text = RESULTS.read_text()
    assert "\n## Studies\n" in text, "RESULTS.md has no '## Studies' section"
    return text.split("\n## Studies\n", 1)[1]


def test_every_study_folder_has_one_row():
    rows = re.findall(r"^\| \[([A-Za-z0-9_.-]+)\]\(results/([A-Za-z0-9_.-]+)/\) \|", _studies_table(), re.M)
    names = [folder for _, folder in rows]
    for label, folder in rows:
        assert label == folder, f"row [{label}] links to results/{folder}/"
    folders = sorted(p.name for p in FOLDERS.iterdir() if p.is_dir())
    assert sorted(set(folders) - set(names)) == [], "study folders without a row in RESULTS.md"
    assert sorted(set(names) - set(folders)) == [], "rows of RESULTS.md for folders that do not exist"
    assert sorted(n for n in set(names) if names.count(n) > 1) == [], "study folders with two rows"


def test_every_table_row_has_its_columns_and_links_resolve():
    text = RESULTS.read_text()
    for section in re.split(r"\n## ", text):
        lines = [l for l in section.splitlines() if l.startswith("|")]
        if not lines:
            continue
        width = lines[0].count("|")
        for l in lines:
            assert l.count("|") - l.count("\\|") == width, f"a row with the wrong number of cells: {l[:100]}"
    for target in re.findall(r"\]\((results/[^)#]+)\)", text):
        assert (RESULTS.parent / target).exists(), f"RESULTS.md links to {target}, which does not exist"
