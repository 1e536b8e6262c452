import json, sys
def base(r):
    n = r.get('run_name') or r['name']
    if n.endswith('_median'): n = n[:-7]
    return '/'.join(x for x in n.split('/') if ':' not in x and x != 'manual_time')
def med(path):
    d = json.load(open(path))
    out = {}
    for b in d['benchmarks']:
        if b.get('aggregate_name') == 'median':
            out.setdefault(base(b), []).append(b)
    return d, out
shapes = ['b128_kv8192_p16', 'b16_kv4096_p16', 'b1_kv16384_p16', 'b1_kv131072_p16']
R, new1 = med('results.json')
_, head1 = med('head1.json'); _, new2 = med('new2.json'); _, head2 = med('head2.json')
_, h100s = med('/work/main/docs/results/h100_split_kv_2026-11-21.json')
_, h100d = med('/work/main/docs/results/h100_decode_2026-11-21.json')
def t(rows, name): return rows[name][0]['real_time'] if name in rows else float('nan')
print('device:', R['context']['device'], '| copy ceiling', R['context']['copy_ceiling_GB/s'][:6])
print('%-30s %8s %8s %8s %8s | %7s %7s' % ('row (us, median)', 'new1', 'head1', 'new2', 'head2', 'new/head', 'spread'))
for st in ('02_paged', '03_split_kv'):
    for s in shapes:
        n = f'{st}/{s}'
        a1, b1, a2, b2 = t(new1, n), t(head1, n), t(new2, n), t(head2, n)
        ratio = (a1 + a2) / (b1 + b2)
        spread = max(abs(a1 - a2) / a2, abs(b1 - b2) / b2)
        print('%-30s %8.1f %8.1f %8.1f %8.1f | %7.4f %6.2f%%' % (n, a1, b1, a2, b2, ratio, 100 * spread))
print()
print('GB/s ratio vs cuDNN (this run: new1 / peer) vs committed H100 runs')
for st in ('02_paged', '03_split_kv'):
    for s in shapes:
        n = f'{st}/{s}'; p = f'peer_torch_sdpa_cudnn/{s}'
        r_new = new1[n][0]['GB/s'] / new1[p][0]['GB/s']
        r_head = [rows[n][0]['GB/s'] / new1[p][0]['GB/s'] for rows in (head1, head2)]
        c1 = h100s[n][0]['GB/s'] / h100s[p][0]['GB/s'] if n in h100s and p in h100s else float('nan')
        c2 = h100d[n][0]['GB/s'] / h100d[p][0]['GB/s'] if n in h100d and p in h100d else float('nan')
        print('%-30s new %.3f  head %.3f/%.3f | H100 split_kv run %.3f  decode run %.3f' % (n, r_new, *r_head, c1, c2))
