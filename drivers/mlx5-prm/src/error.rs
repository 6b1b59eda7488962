//! The crate's one error type.

/// What went wrong with a PRM buffer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `new_checked` got a buffer shorter than the structure.
    #[error(
        "{structure}: buffer of {got} bytes is shorter than the structure's {needed}; pass the whole structure (mailbox data included)"
    )]
    Truncated {
        /// The PRM structure.
        structure: &'static str,
        /// Bytes the structure needs.
        needed: usize,
        /// Bytes the buffer has.
        got: usize,
    },
    /// A setter got a value that does not fit the field; nothing was written.
    #[error(
        "{structure}.{field}: value {value:#x} does not fit in {width} bits; check the value against the device limit"
    )]
    ValueTooWide {
        /// The PRM structure (empty from the bare `set_bits` helper).
        structure: &'static str,
        /// The field (empty from the bare `set_bits` helper).
        field: &'static str,
        /// The field's width in bits.
        width: u32,
        /// The rejected value.
        value: u64,
    },
    /// A bit range does not lie inside the buffer.
    #[error("bits {bit_offset}..+{width} lie outside a {buf_len}-byte buffer")]
    FieldOutOfBounds {
        /// First bit.
        bit_offset: usize,
        /// Width in bits.
        width: u32,
        /// Buffer length in bytes.
        buf_len: usize,
    },
    /// `get_bits`/`set_bits` handle 1..=64 bits; wider fields are byte arrays.
    #[error("field width {width} is not in 1..=64 bits; access wider fields as bytes")]
    WidthUnsupported {
        /// The requested width.
        width: u32,
    },
    /// An index past a fixed-size array field.
    #[error("{structure}.{field}: index {index} is past the array's {count} elements")]
    IndexOutOfRange {
        /// The PRM structure.
        structure: &'static str,
        /// The array field.
        field: &'static str,
        /// The requested index.
        index: usize,
        /// Elements in the array.
        count: u32,
    },
}

impl Error {
    /// Names the structure and field in a [`Error::ValueTooWide`] from the bare helper.
    pub fn in_field(self, structure: &'static str, field: &'static str) -> Self {
        match self {
            Error::ValueTooWide { width, value, .. } => Error::ValueTooWide {
                structure,
                field,
                width,
                value,
            },
            other => other,
        }
    }
}
