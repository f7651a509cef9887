#!/usr/bin/env bash
# The wheel check: `pip wheel --no-build-isolation .` gives a wheel that installs into a fresh
# virtual environment holding only torch and numpy, and runs there from outside the source tree:
# a 2-rank torchrun DDP job with dynamiq's hook (replicas bit-identical, bytes on the wire) and
# `python -m dynamiq.bench --local 2`. Run by scripts/test.sh after scripts/setup.sh.
#
# - The wheel reuses the build directory of the editable install (pyproject.toml: build-dir =
#   "build/{wheel_tag}"), so it links what setup.sh compiled instead of compiling a second time.
# - The fresh venv (made without pip) gets only the dynamiq wheel in its own site-packages,
#   installed by .venv's pip (--python) with --no-index: its torch and numpy requirement must be
#   met by what is there. torch, numpy and the distributions they require are made visible from
#   .venv through a .pth file naming a directory of links to exactly those distributions: a real
#   install of the torch 2.14.1 wheel (CUDA build, with its nvidia-* libraries) copies about 5 GB.
# KEEP_WORK=1 keeps the temporary directory (wheel, venv, logs) for a look afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$PWD
VPY=$SRC/.venv/bin/python
[ -x "$VPY" ] || { echo "check_wheel: run scripts/setup.sh first"; exit 1; }
WORK=$(mktemp -d /tmp/dynamiq-wheel.XXXXXX)
trap '[ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"' EXIT
log() { printf '[wheel] %s\n' "$*"; }
unset PYTHONPATH
export PYTHONNOUSERSITE=1 GLOO_SOCKET_IFNAME=lo

log "pip wheel --no-build-isolation --no-deps . (reusing build/ of the editable install)"
PATH="$SRC/.venv/bin:$PATH" "$VPY" -m pip wheel -q --no-build-isolation --no-deps -w "$WORK/dist" . \
  >"$WORK/wheel.log" 2>&1 || { grep -v "^WARNING: Location" "$WORK/wheel.log" | tail -40; exit 1; }
WHEEL=$(ls "$WORK"/dist/dynamiq-*.whl)
"$VPY" - "$WHEEL" <<'EOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
need = ["dynamiq/__init__.py", "dynamiq/_build_info.py", "dynamiq/bench.py"]
missing = [n for n in need if n not in names] + ([] if any(n.startswith("dynamiq/_C.") and n.endswith(".so") for n in names) else ["dynamiq/_C*.so"])
assert not missing, f"wheel lacks {missing}: {names}"
print(f"[wheel] {sys.argv[1].rsplit('/', 1)[1]}: {len(names)} files, extension and build record included")
EOF

log "fresh venv with only torch and numpy (and what they require)"
BASE=$("$VPY" -c 'import sys; print(sys._base_executable)')
"$BASE" -m venv --without-pip "$WORK/venv"  # (no pip, no setuptools 65 of ensurepip shadowing torch's)
FPY=$WORK/venv/bin/python
SITE=$("$FPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$VPY" - "$WORK/deps" "$SITE/torch_numpy_from_setup_venv.pth" <<'EOF'
# Links, in one directory, the files of torch, numpy and every distribution they require
# (transitively, markers evaluated here), as installed in .venv; names that directory in a .pth.
import os, re, sys
from importlib import metadata
from packaging.requirements import Requirement

deps_dir, pth = sys.argv[1], sys.argv[2]
os.makedirs(deps_dir)
todo, seen = ["torch", "numpy"], {}
while todo:
    name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
    if name in seen:
        continue
    dist = metadata.distribution(name)
    seen[name] = dist
    for req in dist.requires or []:
        r = Requirement(req)
        if r.marker is None or r.marker.evaluate({"extra": ""}):
            todo.append(r.name)
            # requirements with extras (cuda-toolkit[cublas,...]) pull in their extras' requirements
            for extra in r.extras:
                for sub in metadata.distribution(r.name).requires or []:
                    s = Requirement(sub)
                    if s.marker is not None and s.marker.evaluate({"extra": extra}):
                        todo.append(s.name)
tops = set()
for dist in seen.values():
    for f in dist.files or []:
        parts = f.parts
        if parts and parts[0] != ".." and not parts[0].endswith(".pth") and parts[0] != "__pycache__":
            tops.add(str(dist.locate_file(parts[0])))
for t in sorted(tops):
    os.symlink(t, os.path.join(deps_dir, os.path.basename(t)))
with open(pth, "w") as f:
    f.write(deps_dir + "\n")
print(f"[wheel] {len(seen)} distributions linked: {', '.join(sorted(seen))}")
EOF

log "pip install --no-index the wheel into the fresh venv"
"$VPY" -m pip --python "$FPY" install -q --no-index "$WHEEL" >"$WORK/install.log" 2>&1 \
  || { grep -v "^WARNING: Location" "$WORK/install.log"; exit 1; }
"$VPY" -m pip --python "$FPY" list --format=freeze 2>/dev/null | grep -iE "^(dynamiq|torch|numpy)==" \
  | sed 's/^/[wheel]   /'

mkdir "$WORK/run"
cd "$WORK/run"
cat >ddp_job.py <<'EOF'
import os, sys
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import dynamiq

site = sys.argv[1]
assert dynamiq.__file__.startswith(site), f"dynamiq imported from {dynamiq.__file__}, not the wheel in {site}"
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 64))
ddp = DDP(model, bucket_cap_mb=1)
state = dynamiq.register(ddp, dynamiq.Config(mode="dynamiq", bits=5.0))
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
g = torch.Generator().manual_seed(100 + rank)
sent = 0
for step in range(5):
    opt.zero_grad()
    loss = ddp(torch.randn(32, 256, generator=g)).square().mean()
    loss.backward()
    opt.step()
    sent += sum(s["bytes_sent"] for s in state.last_step_stats)
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
dist.all_gather(gathered, flat)
assert all(torch.equal(gathered[0], t) for t in gathered), "replicas differ after training with the hook"
assert sent > 0, "the hook sent nothing"
if rank == 0:
    print(f"[wheel] 2-rank DDP job: 5 steps through dynamiq's hook ({sent} bytes sent by rank 0), "
          f"replicas bit-identical; dynamiq from {os.path.dirname(dynamiq.__file__)}", flush=True)
dist.destroy_process_group()
EOF
log "2-rank torchrun DDP job in $WORK/run"
"$FPY" -m torch.distributed.run --standalone --nproc_per_node 2 ddp_job.py "$SITE" >job.log 2>&1 \
  || { cat job.log; exit 1; }
grep "^\[wheel\]" job.log
log "python -m dynamiq.bench --local 2 from the wheel"
"$FPY" -m dynamiq.bench --local 2 --sizes 64K --modes none,dynamiq:5 --topologies ring --warmup 1 --iters 2 \
  --json bench.json >bench.log 2>&1 || { cat bench.log; exit 1; }
"$FPY" -c 'import json; d = json.load(open("bench.json")); assert len(d["rows"]) == 3 and not any(r["error"] for r in d["rows"]), d' \
  || { cat bench.log; exit 1; }
log "ok"
