//! Shared by the layout tests: every declared field, nested ones expanded, with the source
//! that checks it.

use rnic_mlx5_prm::{FieldKind, FieldLayout, Source, StructLayout};

/// One flattened field: path, absolute bit offset, width, the field itself, and whether it
/// (or a nested field holding it) is doc-sourced.
#[allow(dead_code)]
pub struct Flat {
    pub path: String,
    pub bit_offset: u32,
    pub width: u32,
    pub field: FieldLayout,
    pub doc: bool,
}

pub fn flatten(layout: &StructLayout) -> Vec<Flat> {
    let mut out = Vec::new();
    walk(layout, "", 0, !layout.source.is_ifc(), &mut out);
    out
}

fn walk(layout: &StructLayout, prefix: &str, base: u32, doc: bool, out: &mut Vec<Flat>) {
    for f in layout.fields {
        let path = format!("{prefix}{}", f.name);
        let doc = doc || matches!(f.source, Source::Doc(_));
        out.push(Flat {
            path: path.clone(),
            bit_offset: base + f.bit_offset,
            width: f.width,
            field: *f,
            doc,
        });
        if let FieldKind::Nested(inner) = f.kind {
            walk(inner, &format!("{path}."), base + f.bit_offset, doc, out);
        }
    }
}
