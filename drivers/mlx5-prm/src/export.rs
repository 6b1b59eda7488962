//! The whole table as JSON, in the format `mlx5_ifc_layout.md` gives for "a layout exported
//! by rnic": `{"structs": {NAME: {"fields": {FIELD: [bit_offset, width]}, "size_bits": N}}}`.
//! Nested structures are also expanded into dotted paths (`qpc.primary_address_path.rgid_rip`)
//! with offsets from the outer structure, as the JSON's `flat` does.

use crate::{ALL_LAYOUTS, FieldKind, StructLayout};
use std::fmt::Write as _;

/// Every `(path, bit_offset, width)` of `layout`, nested structures expanded, offsets from
/// the start of `layout`.
pub fn flat_fields(layout: &StructLayout) -> Vec<(String, u32, u32)> {
    let mut out = Vec::new();
    push_flat(layout, "", 0, &mut out);
    out
}

fn push_flat(layout: &StructLayout, prefix: &str, base: u32, out: &mut Vec<(String, u32, u32)>) {
    for f in layout.fields {
        let path = format!("{prefix}{}", f.name);
        out.push((path.clone(), base + f.bit_offset, f.width));
        if let FieldKind::Nested(inner) = f.kind {
            push_flat(inner, &format!("{path}."), base + f.bit_offset, out);
        }
    }
}

fn push_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The given layouts as JSON text (one struct per line, names in the given order).
pub fn layouts_json_of(layouts: &[&StructLayout]) -> String {
    let mut out = String::from("{\"structs\": {");
    for (i, layout) in layouts.iter().enumerate() {
        out.push_str(if i == 0 { "\n  " } else { ",\n  " });
        push_json_string(&mut out, layout.name);
        out.push_str(": {\"fields\": {");
        for (j, (path, off, width)) in flat_fields(layout).iter().enumerate() {
            if j > 0 {
                out.push_str(", ");
            }
            push_json_string(&mut out, path);
            let _ = write!(out, ": [{off}, {width}]");
        }
        let _ = write!(out, "}}, \"size_bits\": {}}}", layout.size_bits);
    }
    out.push_str("\n}}\n");
    out
}

/// Every declared structure as JSON text: what `rnicctl mlx5 layouts --json` prints.
pub fn layouts_json() -> String {
    layouts_json_of(ALL_LAYOUTS)
}
