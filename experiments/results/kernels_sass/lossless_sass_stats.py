#!/usr/bin/env python3
"""Per kernel of a `cuobjdump -sass` listing: static SASS instructions (NOPs and the
trailing self-branch left out), the loops (a backward branch: its target..itself, with
their instruction counts), and the global/shared memory instructions by width.
Usage: sass_stats.py listing.sass [name-filter]"""
import re, sys, collections

def demangle_short(name):
    # the shortest length-prefixed identifier ending in _kernel (the mangled name's last part)
    cands = []
    for m in re.finditer(r'\d+(?=[A-Za-z_])', name):
        for k in (1, 2):
            if k > len(m.group(0)): break
            n = int(m.group(0)[-k:]); w = name[m.end():m.end() + n]
            if w.endswith('_kernel') and len(w) == n: cands.append(w)
    s = min(cands, key=len) if cands else name[-40:]
    t = re.search(r'DTypeE(\d)', name)
    if t: s += '<' + ['f32', 'bf16', 'f16'][int(t.group(1))] + '>'
    b = re.search(r'Lb([01])E', name)
    if b: s += '[aligned]' if b.group(1) == '1' else '[bytewise]'
    return s

def main():
    path = sys.argv[1]
    filt = sys.argv[2] if len(sys.argv) > 2 else ''
    funcs = collections.OrderedDict()
    cur = None
    for line in open(path):
        m = re.match(r'\s*Function : (\S+)', line)
        if m:
            cur = m.group(1); funcs[cur] = []; continue
        m = re.match(r'\s*/\*([0-9a-f]{4,})\*/\s+(.*?);', line)
        if m and cur:
            funcs[cur].append((int(m.group(1), 16), m.group(2).strip()))
    for name, ins in funcs.items():
        if filt not in name: continue
        body = [(a, t) for a, t in ins if not t.startswith('NOP')]
        if body and re.match(r'BRA 0x%x$' % body[-1][0], body[-1][1].split(' ', 1)[-1] if False else body[-1][1]):
            body = body[:-1]
        # drop the final self-branch "BRA <own address>"
        body = [(a, t) for a, t in body if not re.fullmatch(r'BRA 0x%x' % a, t)]
        addr = {a: i for i, (a, _) in enumerate(body)}
        loops = []
        for i, (a, t) in enumerate(body):
            m = re.search(r'BRA (?:`?\(?)?0x([0-9a-f]+)', t)
            if m:
                tgt = int(m.group(1), 16)
                if tgt <= a:
                    j = min((k for k, (b, _) in enumerate(body) if b >= tgt), default=i)
                    loops.append((tgt, a, i - j + 1))
        mem = collections.Counter()
        for _, t in body:
            op = re.sub(r'^@!?U?P\w+\s+', '', t).split()[0]
            if re.match(r'(LDG|STG|LDS|STS|ATOMS|ATOMG|ATOM|RED|LD|ST|SHFL|BAR|VOTE|MATCH)\b', op.split('.')[0]):
                mem[op] += 1
        print(f'{demangle_short(name)}: {len(body)} instructions')
        for tgt, a, n in loops:
            print(f'    loop 0x{tgt:x}..0x{a:x}: {n} instructions')
        print('    ' + ', '.join(f'{k} x{v}' for k, v in sorted(mem.items())))

main()
