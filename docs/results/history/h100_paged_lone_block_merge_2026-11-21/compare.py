"""Side-by-side table of ab_check.sh's runs: new{1,2,3}.json, head{1,2,3}.json, peers.json.
Medians of 5 repetitions per run; new/head = sum(new) / sum(head); spread = the largest
change between two runs of one binary on that row, relative to their mean."""
import json, sys, os
d = sys.argv[1] if len(sys.argv) > 1 else '.'
def base(r):
    n = r.get('run_name') or r['name']
    if n.endswith('_median'): n = n[:-7]
    return '/'.join(x for x in n.split('/') if ':' not in x and x != 'manual_time')
def med(path):
    out = {}
    for b in json.load(open(path))['benchmarks']:
        if b.get('aggregate_name') == 'median':
            out[base(b)] = b['real_time']
    return out
new = [med(os.path.join(d, f'new{i}.json')) for i in (1, 2, 3)]
head = [med(os.path.join(d, f'head{i}.json')) for i in (1, 2, 3)]
peers = json.load(open(os.path.join(d, 'peers.json')))
cudnn = {r['first_shape']: r['median_us'] for r in peers['results'] if r['impl'] == 'torch_sdpa_cudnn'}
shapes = ['b16_kv4096_p16', 'b16_kv1024_p16', 'b1_kv8192_p16', 'b64_kv8192_p16', 'b128_kv8192_p16']
print('%-26s %7s %7s %7s %7s %7s %7s | %8s %7s | %7s %9s %9s' % (
    'row (us, median)', 'new1', 'head1', 'new2', 'head2', 'new3', 'head3', 'new/head', 'spread',
    'cuDNN', 'x new', 'x head'))
for s in shapes:
    n = f'02_paged/{s}'
    a = [r.get(n, float('nan')) for r in new]
    b = [r.get(n, float('nan')) for r in head]
    ratio = sum(a) / sum(b)
    spread = max((max(v) - min(v)) / (sum(v) / len(v)) for v in (a, b))
    c = cudnn.get(s, float('nan'))
    an, bn = sorted(a)[1], sorted(b)[1]
    print('%-26s %7.1f %7.1f %7.1f %7.1f %7.1f %7.1f | %8.4f %6.2f%% | %7.1f %9.3f %9.3f' % (
        n, a[0], b[0], a[1], b[1], a[2], b[2], ratio, 100 * spread, c, c / an, c / bn))
print('x new / x head: cuDNN time over the median of the three runs (>1: faster than cuDNN)')
