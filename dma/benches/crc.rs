//! CRC-32 throughput: crc32fast (over a slice) against `rnic_dma::crc` —
//! the selected kernel over a slice and in place over a `DirectSpan`, and
//! each folding kernel forced — at 64 B, 1 KiB, 4 KiB, 64 KiB and 1 MiB
//! (cache-resident: the same buffer every iteration).
//!
//! `cargo bench -p rnic-dma --bench crc`
#![allow(clippy::unwrap_used, missing_docs)]

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use rnic_core::{HeapMemory, Memory};
use rnic_dma::crc::{Kernel, crc32, crc32_span, crc32_with};

fn crc(c: &mut Criterion) {
    let mut g = c.benchmark_group("crc32");
    for size in [64usize, 1 << 10, 4 << 10, 64 << 10, 1 << 20] {
        let data: Vec<u8> = (0..size).map(|i| (i * 31 + 7) as u8).collect();
        let mem = HeapMemory::from_bytes(&data);
        let span = mem.direct().unwrap();
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(BenchmarkId::new("crc32fast", size), &data, |b, d| {
            b.iter(|| {
                let mut h = crc32fast::Hasher::new_with_initial(black_box(0));
                h.update(d);
                black_box(h.finalize())
            })
        });
        g.bench_with_input(BenchmarkId::new("rnic_slice", size), &data, |b, d| {
            b.iter(|| black_box(crc32(black_box(0), d)))
        });
        g.bench_with_input(BenchmarkId::new("rnic_span", size), &span, |b, s| {
            b.iter(|| black_box(crc32_span(black_box(0), s, 0, size).unwrap()))
        });
        for k in [Kernel::Vpclmul256, Kernel::Pclmul128, Kernel::Portable] {
            if k.is_available() && k != Kernel::selected() {
                g.bench_with_input(BenchmarkId::new(k.name(), size), &data, |b, d| {
                    b.iter(|| black_box(crc32_with(k, black_box(0), d).unwrap()))
                });
            }
        }
    }
    g.finish();
}

criterion_group!(benches, crc);
criterion_main!(benches);
