# Regenerates mlx5_ifc_layout.json here from the full reference table: run from
# drivers/mlx5-prm as `python3 tests/data/make_subset.py ../../../shared/reference/mlx5_ifc_layout.json`.
# Keeps the structures declared with `source: Source::Ifc` in src/structs/*.rs, and of the
# capability union only the cmd_hca_cap, roce_cap, per_protocol_networking_offload_caps and
# flow_table_nic_cap paths.
import glob, json, re, sys
names = sorted({m for f in glob.glob('src/structs/*.rs') for m in re.findall(r'mod \w+ = "(\w+)", size_bits: \w+, source: Source::Ifc', open(f).read())})
src = json.load(open(sys.argv[1]))
keep = lambda k: not k.startswith('capability.') or k.split('.')[1] in ('cmd_hca_cap', 'roce_cap', 'per_protocol_networking_offload_caps', 'flow_table_nic_cap')
sub = lambda s: {'size_bits': s['size_bits'], 'fields': s['fields'], 'flat': {k: v for k, v in s['flat'].items() if keep(k)}, 'arrays': {k: v for k, v in s.get('arrays', {}).items() if keep(k)}}
meta = {k: src['meta'][k] for k in ('source_repo', 'path', 'extra_paths', 'commit', 'commit_subject', 'file_blob', 'units')}
json.dump({'meta': meta, 'structs': {n: sub(src['structs'][n]) for n in names}}, open('tests/data/mlx5_ifc_layout.json', 'w'), indent=0, sort_keys=True)
