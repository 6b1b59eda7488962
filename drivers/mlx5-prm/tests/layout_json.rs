//! Every ifc-declared structure and field against `tests/data/mlx5_ifc_layout.json` (a subset
//! of the reference table, see tests/data/README.md), and the JSON export.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use rnic_mlx5_prm::{ALL_LAYOUTS, FieldKind, Source, export, layout};
use serde_json::Value;
use std::collections::HashSet;

fn reference() -> Value {
    serde_json::from_str(include_str!("data/mlx5_ifc_layout.json")).expect("test data parses")
}

fn pair(v: &Value) -> Option<(u64, u64)> {
    Some((v.get(0)?.as_u64()?, v.get(1)?.as_u64()?))
}

#[test]
fn every_ifc_struct_field_and_size_matches_the_json() {
    let reference = reference();
    let mut checked = 0;
    let mut failures = Vec::new();
    for l in ALL_LAYOUTS {
        let s = &reference["structs"][l.name];
        if !l.source.is_ifc() {
            assert!(
                s.is_null(),
                "{} is doc-sourced but in the ifc subset",
                l.name
            );
            continue;
        }
        assert!(
            s.is_object(),
            "{} missing from tests/data (rerun make_subset.py)",
            l.name
        );
        assert_eq!(
            s["size_bits"].as_u64(),
            Some(u64::from(l.size_bits)),
            "{} size",
            l.name
        );
        for f in common::flatten(l) {
            let json = &s["flat"][&f.path];
            if f.doc {
                // A doc field must really be absent from the header, or it should be ifc.
                if !json.is_null() {
                    failures.push(format!(
                        "{}.{} is marked doc but the JSON has it",
                        l.name, f.path
                    ));
                }
                continue;
            }
            match pair(json) {
                Some(p) if p == (u64::from(f.bit_offset), u64::from(f.width)) => checked += 1,
                other => failures.push(format!(
                    "{}.{}: declared [{:#x}, {}], JSON {:?}",
                    l.name, f.path, f.bit_offset, f.width, other
                )),
            }
            if let FieldKind::Array { elem_bits, count } = f.field.kind {
                let a = &s["arrays"][&f.path];
                assert_eq!(
                    a["elem_bits"].as_u64(),
                    Some(u64::from(elem_bits)),
                    "{}.{}",
                    l.name,
                    f.path
                );
                assert_eq!(
                    a["count"].as_u64(),
                    count.map(u64::from),
                    "{}.{}",
                    l.name,
                    f.path
                );
                assert_eq!(
                    a["flex"].as_bool(),
                    Some(count.is_none()),
                    "{}.{}",
                    l.name,
                    f.path
                );
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(checked > 1500, "only {checked} fields checked");
}

#[test]
fn spot_values_from_mlx5_ifc_layout_md() {
    let f = |s: &str, p: &str| {
        let l = layout(s).expect("declared");
        common::flatten(l)
            .into_iter()
            .find(|f| f.path == p)
            .map(|f| (f.bit_offset, f.width))
            .expect("field declared")
    };
    assert_eq!(layout("qpc").map(|l| l.size_bits), Some(0x740));
    assert_eq!(f("qpc", "state"), (0, 4));
    assert_eq!(f("qpc", "pd"), (0x28, 24));
    assert_eq!(f("qpc", "primary_address_path").0, 0xc0);
    assert_eq!(f("create_qp_in", "qpc").0, 0xc0);
    assert_eq!(f("create_qp_in", "pas"), (0x880, 64));
    assert_eq!(layout("ads").map(|l| l.size_bits), Some(0x160));
    assert_eq!(f("ads", "rgid_rip"), (0x80, 128));
    assert_eq!(f("ads", "rmac_47_32").0, 0x130);
    assert_eq!(f("cqc", "log_cq_size"), (0x63, 5));
    assert_eq!(f("mkc", "len"), (0xc0, 64));
    assert_eq!(f("cmd_hca_cap", "log_max_qp"), (0x9b, 5));
    assert_eq!(f("cmd_hca_cap", "port_type"), (0x1b6, 2));
    assert_eq!(f("manage_pages_in", "pas").0, 0x80);
    assert_eq!(f("query_hca_cap_out", "capability.cmd_hca_cap").0, 0x80);
    assert_eq!(
        f("query_hca_cap_out", "capability.cmd_hca_cap.log_max_qp").0,
        0x80 + 0x9b
    );
}

#[test]
fn every_command_starts_with_the_common_header() {
    let mut n = 0;
    for l in ALL_LAYOUTS
        .iter()
        .filter(|l| l.name.ends_with("_in") || l.name.ends_with("_out"))
    {
        let get = |name: &str| l.field(name).map(|f| (f.bit_offset, f.width));
        if l.name.ends_with("_in") {
            assert_eq!(get("opcode"), Some((0, 16)), "{}", l.name);
            assert_eq!(get("op_mod"), Some((0x30, 16)), "{}", l.name);
        } else {
            assert_eq!(get("status"), Some((0, 8)), "{}", l.name);
            assert_eq!(get("syndrome"), Some((0x20, 32)), "{}", l.name);
        }
        n += 1;
    }
    assert!(n >= 80, "{n} commands");
}

#[test]
fn names_are_unique() {
    let mut seen = HashSet::new();
    for l in ALL_LAYOUTS {
        assert!(seen.insert(l.name), "{} declared twice", l.name);
        let mut fields = HashSet::new();
        for f in l.fields {
            assert!(
                fields.insert(f.name),
                "{}.{} declared twice",
                l.name,
                f.name
            );
        }
    }
}

#[test]
fn export_parses_and_round_trips_the_table() {
    let text = export::layouts_json();
    let parsed: Value = serde_json::from_str(&text).expect("export is JSON");
    let structs = parsed["structs"].as_object().expect("structs object");
    assert_eq!(structs.len(), ALL_LAYOUTS.len());
    for l in ALL_LAYOUTS {
        let s = &structs[l.name];
        assert_eq!(
            s["size_bits"].as_u64(),
            Some(u64::from(l.size_bits)),
            "{}",
            l.name
        );
        let fields = s["fields"].as_object().expect("fields object");
        let flat = export::flat_fields(l);
        assert_eq!(fields.len(), flat.len(), "{}", l.name);
        for (path, off, width) in flat {
            assert_eq!(
                pair(&fields[&path]),
                Some((u64::from(off), u64::from(width))),
                "{}.{path}",
                l.name
            );
        }
    }
    // The example the brief and `rnicctl mlx5 layouts --json` rely on.
    assert_eq!(
        pair(&parsed["structs"]["create_qp_in"]["fields"]["pas"]),
        Some((2176, 64))
    );
    assert_eq!(
        pair(&parsed["structs"]["create_qp_in"]["fields"]["qpc.primary_address_path.rgid_rip"]),
        Some((0xc0 + 0xc0 + 0x80, 128))
    );
}

#[test]
fn export_escapes_names() {
    use rnic_mlx5_prm::{FieldLayout, StructLayout};
    const FIELDS: &[FieldLayout] = &[FieldLayout {
        name: "a\"b\\c\n",
        bit_offset: 1,
        width: 2,
        kind: FieldKind::Value,
        source: Source::Doc("test"),
    }];
    const L: StructLayout = StructLayout {
        name: "t",
        size_bits: 8,
        source: Source::Doc("test"),
        fields: FIELDS,
    };
    let parsed: Value = serde_json::from_str(&export::layouts_json_of(&[&L])).expect("JSON");
    assert_eq!(
        pair(&parsed["structs"]["t"]["fields"]["a\"b\\c\n"]),
        Some((1, 2))
    );
}
