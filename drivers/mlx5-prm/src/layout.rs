//! The layout table types and the [`prm_struct!`](crate::prm_struct) macro that fills them.

/// Where a field's (or a structure's) offsets come from, and so what checks them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// `include/linux/mlx5/mlx5_ifc.h`: held against `mlx5_ifc_layout.json` by the tests.
    Ifc,
    /// Not in the ifc header (device.h structs, doorbells, WQE/CQE formats); the string names
    /// the section of `mlx5.md` (or other source) whose byte offsets the tests hold it against.
    Doc(&'static str),
}

impl Source {
    /// Whether `mlx5_ifc_layout.json` is the reference.
    pub const fn is_ifc(self) -> bool {
        matches!(self, Source::Ifc)
    }
}

/// How a field is accessed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldKind {
    /// An unsigned integer of 1..=64 bits (`u32` accessors up to 32 bits, `u64` above).
    Value,
    /// A byte-aligned byte array (GIDs, MAC halves wider than 64 bits, opaque areas).
    Bytes,
    /// A nested PRM structure (`create_qp_in.qpc` holds a `qpc`).
    Nested(&'static StructLayout),
    /// An array of integers; `width` of the field is the whole array for a fixed count and
    /// one element for a flexible array (the JSON's convention).
    Array {
        /// Bits per element.
        elem_bits: u32,
        /// Number of elements; `None` for a flexible array (`pas[]`) that runs to the end of
        /// the buffer.
        count: Option<u32>,
    },
}

/// One field: its PRM name, bit offset and width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldLayout {
    /// The PRM name: a field of this structure, or a dotted path for a sub-field that rnic
    /// splits out (`sop_drop_qpn.qpn`).
    pub name: &'static str,
    /// Offset in bits from the start of the structure, MSB-first in big-endian dwords.
    pub bit_offset: u32,
    /// Width in bits (one element for a flexible array).
    pub width: u32,
    /// How it is accessed.
    pub kind: FieldKind,
    /// What the tests check it against.
    pub source: Source,
}

impl FieldLayout {
    /// The byte holding the field's first (most significant) bit.
    pub const fn byte_offset(&self) -> usize {
        (self.bit_offset / 8) as usize
    }

    /// Bytes the field touches when it starts on a byte boundary (`width / 8` rounded up).
    pub const fn byte_len(&self) -> usize {
        self.width.div_ceil(8) as usize
    }

    /// Byte offset of the big-endian dword holding the field's first bit.
    pub const fn dword_offset(&self) -> usize {
        (self.bit_offset / 32 * 4) as usize
    }

    /// For a field inside one dword, the right shift that brings it to bit 0 of the
    /// host-order dword (`32 - off % 32 - width`); `None` when it spans dwords.
    pub const fn dword_shift(&self) -> Option<u32> {
        let in_dword = self.bit_offset % 32;
        if self.width == 0 || in_dword + self.width > 32 {
            None
        } else {
            Some(32 - in_dword - self.width)
        }
    }

    /// The field's value from its host-order dword (what an `Mmio::read32` returned after
    /// `u32::from_be`); 0 for a field that spans dwords.
    pub const fn extract(&self, dword: u32) -> u32 {
        match self.dword_shift() {
            Some(shift) => (dword >> shift) & (crate::bits::mask(self.width) as u32),
            None => 0,
        }
    }

    /// `dword` with the field replaced by `value` (masked to the field's width); `dword`
    /// unchanged for a field that spans dwords.
    pub const fn insert(&self, dword: u32, value: u32) -> u32 {
        match self.dword_shift() {
            Some(shift) => {
                let m = (crate::bits::mask(self.width) as u32) << shift;
                (dword & !m) | ((value << shift) & m)
            }
            None => dword,
        }
    }

    /// Bit offset of element `index` of an array field (`offset + index * elem_bits`); the
    /// field's own offset for other kinds.
    pub const fn element_bit_offset(&self, index: u32) -> u32 {
        match self.kind {
            FieldKind::Array { elem_bits, .. } => self.bit_offset + index * elem_bits,
            _ => self.bit_offset,
        }
    }
}

/// One PRM structure: name, size and declared fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StructLayout {
    /// The PRM name (`create_qp_in`), as in the JSON (or mlx5.md for the others).
    pub name: &'static str,
    /// Size in bits (a flexible array adds nothing).
    pub size_bits: u32,
    /// What the structure's size is checked against.
    pub source: Source,
    /// The declared fields, in declaration order.
    pub fields: &'static [FieldLayout],
}

impl StructLayout {
    /// Size in bytes.
    pub const fn size_bytes(&self) -> usize {
        self.size_bits.div_ceil(8) as usize
    }

    /// The field with this PRM name.
    pub fn field(&self, name: &str) -> Option<&'static FieldLayout> {
        self.fields.iter().find(|f| f.name == name)
    }
}

/// Declares one PRM structure as a bit-offset table plus a view over byte buffers.
///
/// ```
/// use rnic_mlx5_prm::{prm_struct, Source};
///
/// prm_struct! {
///     /// A two-field example.
///     pub struct Example, mod example = "example", size_bits: 0x40, source: Source::Doc("doc");
///     {
///         /// A 4-bit field at the top of dword 0.
///         state, set_state: u32 [0x0, 4];
///         /// A 64-bit field whose PRM name differs from the accessor.
///         addr, set_addr: u64 [0x0, 64] = "address";
///     }
/// }
///
/// fn main() {
///     let mut buf = [0u8; 8];
///     let mut v = Example::new_checked(&mut buf[..]).unwrap();
///     v.set_state(3).unwrap();
///     assert!(v.set_state(16).is_err()); // wider than 4 bits: rejected, nothing written
///     assert_eq!(v.state(), 3);
///     assert_eq!(buf[0], 0x30);
///     assert_eq!(example::addr.name, "address");
///     assert_eq!(example::LAYOUT.size_bits, 64);
/// }
/// ```
///
/// Invoke it at module level (not inside a function body): the generated offset module
/// resolves the source expression and nested view types through `use super::*`.
///
/// Each field line is `getter, setter: KIND [bit_offset, width] (= "prm.name")? (, doc "src")?;`
/// where KIND is `u32` (1..=32 bits), `u64` (33..=64), `bytes` (byte-aligned, multiple of 8),
/// `{View}` (a nested structure; the setter slot names the `&mut` accessor), `[u32; N]` /
/// `[u64; N]` (fixed array, width = whole array), `[u32; flex]` / `[u64; flex]` (flexible
/// array, width = one element) or `[{View}; flex]` (a flexible array of structures, width =
/// one element; the accessors take an index and give a view of that element, the setter slot
/// names the `&mut` accessor). A nested view reaches to the end of the buffer, so a flexible
/// array that ends a nested structure (`set_fte_in.flow_context.destination`) is reachable
/// through it. The PRM name defaults to the getter's name. `doc "…"` marks a
/// field that is not in the ifc header and names its source. Const assertions reject a field
/// whose width does not suit its kind or that runs past the structure.
#[macro_export]
macro_rules! prm_struct {
    (
        $(#[$attr:meta])*
        $vis:vis struct $View:ident, mod $module:ident = $prm:literal,
        size_bits: $size:expr, source: $src:expr;
        {
            $(
                $(#[$fattr:meta])*
                $get:ident, $set:ident : $kind:tt [$off:expr, $width:expr]
                    $(= $fprm:literal)? $(, doc $fsrc:literal)? ;
            )*
        }
    ) => {
        #[doc = concat!("Offsets of `", $prm, "`: one [`FieldLayout`](", "crate::FieldLayout) per field, named as in the PRM.")]
        #[allow(non_upper_case_globals)]
        $vis mod $module {
            #[allow(unused_imports)]
            use super::*;
            /// The PRM name.
            pub const NAME: &str = $prm;
            /// Size in bits.
            pub const SIZE_BITS: u32 = $size;
            /// Size in bytes.
            pub const SIZE_BYTES: usize = ($size as usize).div_ceil(8);
            $(
                $(#[$fattr])*
                pub const $get: $crate::FieldLayout = $crate::FieldLayout {
                    name: $crate::prm_struct!(@name $get $(, $fprm)?),
                    bit_offset: $off,
                    width: $width,
                    kind: $crate::prm_struct!(@kind $kind, $width),
                    source: $crate::prm_struct!(@src $src $(, $fsrc)?),
                };
            )*
            #[allow(clippy::int_plus_one, clippy::identity_op)]
            const _: () = {
                $( $crate::prm_struct!(@check $kind, $off, $width, SIZE_BITS); )*
            };
            /// The whole table.
            pub const LAYOUT: $crate::StructLayout = $crate::StructLayout {
                name: $prm,
                size_bits: $size,
                source: $src,
                fields: &[$($get),*],
            };
        }

        $(#[$attr])*
        #[doc = ""]
        #[doc = concat!("View over a `", $prm, "` (", stringify!($size), " bits) in a byte buffer. ")]
        #[doc = "Build it with `new_checked` (one length check); no accessor can panic after that."]
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        $vis struct $View<T> {
            buf: T,
        }

        impl<T> $View<T> {
            /// The structure's table.
            pub const LAYOUT: $crate::StructLayout = $module::LAYOUT;
            /// Size in bits.
            pub const SIZE_BITS: u32 = $module::SIZE_BITS;
            /// Size in bytes: the least `new_checked` accepts.
            pub const SIZE_BYTES: usize = $module::SIZE_BYTES;

            /// A view without the length check. Never panics either: reads past the end of a
            /// short buffer give 0 (or an empty slice), writes fail with
            /// [`Error::FieldOutOfBounds`](crate::Error::FieldOutOfBounds).
            pub const fn new_unchecked(buf: T) -> Self {
                Self { buf }
            }

            /// The buffer back.
            pub fn into_inner(self) -> T {
                self.buf
            }
        }

        #[allow(clippy::len_without_is_empty)]
        impl<T: AsRef<[u8]>> $View<T> {
            /// Wraps `buf` after checking it holds the whole structure.
            ///
            /// # Errors
            /// [`Error::Truncated`](crate::Error::Truncated) when `buf` is shorter than
            /// `SIZE_BYTES`.
            pub fn new_checked(buf: T) -> Result<Self, $crate::Error> {
                let got = buf.as_ref().len();
                if got < $module::SIZE_BYTES {
                    return Err($crate::Error::Truncated {
                        structure: $prm,
                        needed: $module::SIZE_BYTES,
                        got,
                    });
                }
                Ok(Self { buf })
            }

            /// The underlying bytes.
            pub fn as_bytes(&self) -> &[u8] {
                self.buf.as_ref()
            }

            $( $crate::prm_struct!(@get [$(#[$fattr])*] $kind, $module, $get, $prm); )*
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> $View<T> {
            /// The underlying bytes, writable.
            pub fn as_bytes_mut(&mut self) -> &mut [u8] {
                self.buf.as_mut()
            }

            $( $crate::prm_struct!(@set $kind, $module, $get, $set, $prm, $width); )*
        }
    };

    (@name $get:ident) => { stringify!($get) };
    (@name $get:ident, $p:literal) => { $p };

    (@src $s:expr) => { $s };
    (@src $s:expr, $d:literal) => { $crate::Source::Doc($d) };

    (@kind u32, $w:expr) => { $crate::FieldKind::Value };
    (@kind u64, $w:expr) => { $crate::FieldKind::Value };
    (@kind bytes, $w:expr) => { $crate::FieldKind::Bytes };
    (@kind {$n:ident}, $w:expr) => { $crate::FieldKind::Nested(&<$n<&'static [u8]>>::LAYOUT) };
    (@kind [{$n:ident}; flex], $w:expr) => {
        $crate::FieldKind::Array { elem_bits: $w, count: None }
    };
    (@kind [$t:ident; flex], $w:expr) => {
        $crate::FieldKind::Array { elem_bits: $w, count: None }
    };
    (@kind [$t:ident; $n:literal], $w:expr) => {
        $crate::FieldKind::Array { elem_bits: ($w) / $n, count: Some($n) }
    };

    (@check u32, $off:expr, $w:expr, $size:expr) => {
        assert!($w >= 1 && $w <= 32 && $off + $w <= $size, "u32 field: 1..=32 bits, inside the struct");
    };
    (@check u64, $off:expr, $w:expr, $size:expr) => {
        assert!($w > 32 && $w <= 64 && $off + $w <= $size, "u64 field: 33..=64 bits, inside the struct");
    };
    (@check bytes, $off:expr, $w:expr, $size:expr) => {
        assert!($off % 8 == 0 && $w % 8 == 0 && $w >= 8 && $off + $w <= $size, "bytes field: byte-aligned, inside the struct");
    };
    (@check {$n:ident}, $off:expr, $w:expr, $size:expr) => {
        assert!($off % 8 == 0 && $w == <$n<&'static [u8]>>::SIZE_BITS && $off + $w <= $size, "nested field: byte-aligned, as wide as the nested struct");
    };
    (@check [{$n:ident}; flex], $off:expr, $w:expr, $size:expr) => {
        assert!($off % 8 == 0 && $off <= $size && $w == <$n<&'static [u8]>>::SIZE_BITS, "flexible array of structures: byte-aligned, one element wide, starting inside the struct");
    };
    (@check [$t:ident; flex], $off:expr, $w:expr, $size:expr) => {
        assert!($off <= $size && $w <= <$t>::BITS, "flexible array: one element wide, starting inside the struct");
    };
    (@check [$t:ident; $n:literal], $off:expr, $w:expr, $size:expr) => {
        assert!($w % $n == 0 && ($w / $n) <= <$t>::BITS && $off + $w <= $size, "fixed array: width = count x element");
    };

    (@get [$($fattr:tt)*] u32, $module:ident, $get:ident, $prm:literal) => {
        $($fattr)*
        #[doc = concat!("\n\n`", $prm, ".", stringify!($get), "` (see `", stringify!($module), "::", stringify!($get), "` for its PRM name and bits).")]
        #[inline]
        pub fn $get(&self) -> u32 {
            let f = $module::$get;
            // Truncation cannot happen: the const check bounds the width to 32 bits.
            $crate::bits::get_bits(self.buf.as_ref(), f.bit_offset as usize, f.width).unwrap_or(0) as u32
        }
    };
    (@get [$($fattr:tt)*] u64, $module:ident, $get:ident, $prm:literal) => {
        $($fattr)*
        #[doc = concat!("\n\n`", $prm, ".", stringify!($get), "` (see `", stringify!($module), "::", stringify!($get), "`).")]
        #[inline]
        pub fn $get(&self) -> u64 {
            let f = $module::$get;
            $crate::bits::get_bits(self.buf.as_ref(), f.bit_offset as usize, f.width).unwrap_or(0)
        }
    };
    (@get [$($fattr:tt)*] bytes, $module:ident, $get:ident, $prm:literal) => {
        $($fattr)*
        #[doc = concat!("\n\n`", $prm, ".", stringify!($get), "` as bytes, in wire order.")]
        #[inline]
        pub fn $get(&self) -> &[u8] {
            let f = $module::$get;
            self.buf.as_ref().get(f.byte_offset()..f.byte_offset() + f.byte_len()).unwrap_or(&[])
        }
    };
    (@get [$($fattr:tt)*] {$n:ident}, $module:ident, $get:ident, $prm:literal) => {
        $($fattr)*
        #[doc = concat!("\n\nThe nested `", stringify!($n), "` at `", $prm, ".", stringify!($get), "` (over the rest of the buffer, so a flexible array ending the nested structure is reachable).")]
        #[inline]
        pub fn $get(&self) -> $n<&[u8]> {
            let f = $module::$get;
            $n::new_unchecked(self.buf.as_ref().get(f.byte_offset()..).unwrap_or(&[]))
        }
    };
    (@get [$($fattr:tt)*] [{$n:ident}; flex], $module:ident, $get:ident, $prm:literal) => {
        $($fattr)*
        #[doc = concat!("\n\nElement `index` of the flexible array of `", stringify!($n), "` at `", $prm, ".", stringify!($get), "`; `None` past the buffer.")]
        #[inline]
        pub fn $get(&self, index: usize) -> Option<$n<&[u8]>> {
            let f = $module::$get;
            let at = index.checked_mul(f.byte_len())?.checked_add(f.byte_offset())?;
            let end = at.checked_add(f.byte_len())?;
            self.buf.as_ref().get(at..end).map($n::new_unchecked)
        }
    };
    (@get [$($fattr:tt)*] [$t:ident; $n:tt], $module:ident, $get:ident, $prm:literal) => {
        $($fattr)*
        #[doc = concat!("\n\nElement `index` of `", $prm, ".", stringify!($get), "`; `None` past the array or the buffer.")]
        #[inline]
        pub fn $get(&self, index: usize) -> Option<$t> {
            let f = $module::$get;
            let (elem_bits, count) = match f.kind {
                $crate::FieldKind::Array { elem_bits, count } => (elem_bits, count),
                _ => return None,
            };
            if count.is_some_and(|c| index >= c as usize) {
                return None;
            }
            let off = (f.bit_offset as usize).checked_add(index.checked_mul(elem_bits as usize)?)?;
            $crate::bits::get_bits(self.buf.as_ref(), off, elem_bits).ok().map(|v| v as $t)
        }
    };

    (@set u32, $module:ident, $get:ident, $set:ident, $prm:literal, $w:expr) => {
        #[doc = concat!("Sets `", $prm, ".", stringify!($get), "`.\n\n# Errors\n[`Error::ValueTooWide`](crate::Error::ValueTooWide) (nothing written) when `value` needs more than ", stringify!($w), " bits.")]
        #[inline]
        pub fn $set(&mut self, value: u32) -> Result<(), $crate::Error> {
            let f = $module::$get;
            $crate::bits::set_bits(self.buf.as_mut(), f.bit_offset as usize, f.width, u64::from(value))
                .map_err(|e| e.in_field($prm, f.name))
        }
    };
    (@set u64, $module:ident, $get:ident, $set:ident, $prm:literal, $w:expr) => {
        #[doc = concat!("Sets `", $prm, ".", stringify!($get), "`.\n\n# Errors\n[`Error::ValueTooWide`](crate::Error::ValueTooWide) (nothing written) when `value` needs more than ", stringify!($w), " bits.")]
        #[inline]
        pub fn $set(&mut self, value: u64) -> Result<(), $crate::Error> {
            let f = $module::$get;
            $crate::bits::set_bits(self.buf.as_mut(), f.bit_offset as usize, f.width, value)
                .map_err(|e| e.in_field($prm, f.name))
        }
    };
    (@set bytes, $module:ident, $get:ident, $set:ident, $prm:literal, $w:expr) => {
        #[doc = concat!("Sets `", $prm, ".", stringify!($get), "` from exactly its ", stringify!($w), " bits of bytes, in wire order.\n\n# Errors\n[`Error::FieldOutOfBounds`](crate::Error::FieldOutOfBounds) only for a view made with `new_unchecked` over a short buffer.")]
        #[inline]
        pub fn $set(&mut self, value: &[u8; ($w as usize) / 8]) -> Result<(), $crate::Error> {
            let f = $module::$get;
            let len = self.buf.as_ref().len();
            match self.buf.as_mut().get_mut(f.byte_offset()..f.byte_offset() + f.byte_len()) {
                Some(dst) => {
                    dst.copy_from_slice(value);
                    Ok(())
                }
                None => Err($crate::Error::FieldOutOfBounds {
                    bit_offset: f.bit_offset as usize,
                    width: f.width,
                    buf_len: len,
                }),
            }
        }
    };
    (@set {$n:ident}, $module:ident, $get:ident, $set:ident, $prm:literal, $w:expr) => {
        #[doc = concat!("The nested `", stringify!($n), "` at `", $prm, ".", stringify!($get), "`, writable (over the rest of the buffer).")]
        #[inline]
        pub fn $set(&mut self) -> $n<&mut [u8]> {
            let f = $module::$get;
            $n::new_unchecked(self.buf.as_mut().get_mut(f.byte_offset()..).unwrap_or(&mut []))
        }
    };
    (@set [{$n:ident}; flex], $module:ident, $get:ident, $set:ident, $prm:literal, $w:expr) => {
        #[doc = concat!("Element `index` of the flexible array of `", stringify!($n), "` at `", $prm, ".", stringify!($get), "`, writable; `None` past the buffer.")]
        #[inline]
        pub fn $set(&mut self, index: usize) -> Option<$n<&mut [u8]>> {
            let f = $module::$get;
            let at = index.checked_mul(f.byte_len())?.checked_add(f.byte_offset())?;
            let end = at.checked_add(f.byte_len())?;
            self.buf.as_mut().get_mut(at..end).map($n::new_unchecked)
        }
    };
    (@set [$t:ident; $n:tt], $module:ident, $get:ident, $set:ident, $prm:literal, $w:expr) => {
        #[doc = concat!("Sets element `index` of `", $prm, ".", stringify!($get), "`.\n\n# Errors\n[`Error::IndexOutOfRange`](crate::Error::IndexOutOfRange) past a fixed array, [`Error::FieldOutOfBounds`](crate::Error::FieldOutOfBounds) past the buffer (a flexible array's end is the buffer's).")]
        #[inline]
        pub fn $set(&mut self, index: usize, value: $t) -> Result<(), $crate::Error> {
            let f = $module::$get;
            let (elem_bits, count) = match f.kind {
                $crate::FieldKind::Array { elem_bits, count } => (elem_bits, count),
                _ => (f.width, Some(1)),
            };
            if let Some(c) = count {
                if index >= c as usize {
                    return Err($crate::Error::IndexOutOfRange { structure: $prm, field: f.name, index, count: c });
                }
            }
            let off = index
                .checked_mul(elem_bits as usize)
                .and_then(|o| o.checked_add(f.bit_offset as usize))
                .unwrap_or(usize::MAX);
            $crate::bits::set_bits(self.buf.as_mut(), off, elem_bits, u64::from(value))
                .map_err(|e| e.in_field($prm, f.name))
        }
    };
}
