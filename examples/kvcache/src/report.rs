//! Reports: human-readable lines and JSON (a tiny writer, no dependencies).

use std::fmt::Write as _;
use std::time::Duration;

use crate::decode::DecodeReport;
use crate::net::Placement;
use crate::prefill::PrefillReport;

/// A JSON object under construction.
#[derive(Debug, Default)]
pub struct Json {
    out: String,
}

impl Json {
    /// `{`.
    pub fn new() -> Json {
        Json { out: "{".into() }
    }

    fn key(&mut self, k: &str) {
        if self.out.len() > 1 {
            self.out.push(',');
        }
        let _ = write!(self.out, "\"{k}\":");
    }

    /// A number.
    pub fn num(mut self, k: &str, v: impl Into<f64>) -> Json {
        self.key(k);
        let v: f64 = v.into();
        if v.is_finite() {
            let _ = write!(self.out, "{v}");
        } else {
            self.out.push_str("null");
        }
        self
    }

    /// An integer.
    pub fn int(mut self, k: &str, v: u64) -> Json {
        self.key(k);
        let _ = write!(self.out, "{v}");
        self
    }

    /// A string (escaped).
    pub fn str(mut self, k: &str, v: &str) -> Json {
        self.key(k);
        self.out.push('"');
        for c in v.chars() {
            match c {
                '"' => self.out.push_str("\\\""),
                '\\' => self.out.push_str("\\\\"),
                c if (c as u32) < 0x20 => {
                    let _ = write!(self.out, "\\u{:04x}", c as u32);
                }
                c => self.out.push(c),
            }
        }
        self.out.push('"');
        self
    }

    /// A boolean.
    pub fn bool(mut self, k: &str, v: bool) -> Json {
        self.key(k);
        self.out.push_str(if v { "true" } else { "false" });
        self
    }

    /// Raw JSON (an object or array built elsewhere).
    pub fn raw(mut self, k: &str, v: &str) -> Json {
        self.key(k);
        self.out.push_str(v);
        self
    }

    /// `}`.
    pub fn finish(mut self) -> String {
        self.out.push('}');
        self.out
    }
}

/// Milliseconds of a duration.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A JSON array of token ids.
pub fn tokens_json(t: &[u32]) -> String {
    format!(
        "[{}]",
        t.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
    )
}

fn placement_json(p: Option<&Placement>) -> String {
    match p {
        None => "null".into(),
        Some(p) => {
            let j = Json::new()
                .str("kind", p.kind)
                .int("page_size", p.page_size as u64)
                .bool("pinned", p.pinned);
            match p.node {
                Some(n) => j.int("numa_node", u64::from(n)),
                None => j.raw("numa_node", "null"),
            }
            .finish()
        }
    }
}

fn placement_text(p: Option<&Placement>) -> String {
    match p {
        None => "-".into(),
        Some(p) => format!(
            "{} memory, {} KiB pages, NUMA node {}, {}",
            p.kind,
            p.page_size / 1024,
            p.node.map_or_else(|| "unknown".into(), |n| n.to_string()),
            if p.pinned { "pinned" } else { "not pinned" }
        ),
    }
}

/// Throughput in GB/s of `bytes` over `d`.
pub fn gbps(bytes: u64, d: Duration) -> f64 {
    if d.is_zero() {
        0.0
    } else {
        bytes as f64 / d.as_secs_f64() / 1e9
    }
}

impl DecodeReport {
    /// The report as JSON.
    pub fn to_json(&self) -> String {
        Json::new()
            .str("transport", self.transport)
            .int("prompt_tokens", u64::from(self.prompt_tokens))
            .int("kv_positions", u64::from(self.kv_positions))
            .int("kv_bytes", self.kv_bytes)
            .int("chunks", u64::from(self.chunks))
            .num("ttft_ms", ms(self.ttft))
            .raw(
                "ttft_breakdown_ms",
                &Json::new()
                    .num("handshake", ms(self.handshake))
                    .num("prefill_compute", ms(self.prefill_compute))
                    .num("transfer_tail", ms(self.transfer_tail))
                    .num("reconstruct", ms(self.reconstruct))
                    .num("first_decode_step", ms(self.first_step))
                    .finish(),
            )
            .num("transfer_share_of_ttft", self.transfer_share())
            .num("stream_ms", ms(self.stream))
            .num("decode_ms", ms(self.decode))
            .num(
                "decode_tokens_per_s",
                self.tokens.len() as f64 / self.decode.as_secs_f64().max(1e-9),
            )
            .int("prefill_credit_stalls", self.prefill_stalls)
            .int("faults_dropped", self.faults.0)
            .int("faults_reordered", self.faults.1)
            .int("retransmits", self.retransmits)
            .str("kv_digest", &format!("{:016x}", self.digest))
            .raw("region", &placement_json(self.placement.as_ref()))
            .str("kv_memory", &self.kv_memory)
            .raw("tokens", &tokens_json(&self.tokens))
            .finish()
    }

    /// The transfer's share of TTFT.
    pub fn transfer_share(&self) -> f64 {
        self.transfer_tail.as_secs_f64() / self.ttft.as_secs_f64().max(1e-12)
    }

    /// The report as text.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "decode[{}]: prompt {} tokens, {} KV positions, {:.2} MiB KV in {} chunks, region: {} [{}]",
            self.transport,
            self.prompt_tokens,
            self.kv_positions,
            self.kv_bytes as f64 / (1 << 20) as f64,
            self.chunks,
            placement_text(self.placement.as_ref()),
            self.kv_memory
        );
        let _ = writeln!(
            s,
            "  TTFT {:.2} ms = handshake {:.2} + prefill compute {:.2} + transfer tail {:.2} + reconstruct {:.3} + first decode step {:.2} (transfer adds {:.2}%)",
            ms(self.ttft),
            ms(self.handshake),
            ms(self.prefill_compute),
            ms(self.transfer_tail),
            ms(self.reconstruct),
            ms(self.first_step),
            100.0 * self.transfer_share()
        );
        let _ = writeln!(
            s,
            "  stream {:.2} ms; {} tokens in {:.2} ms ({:.1} tokens/s); prefill credit stalls {}; faults injected here: {} dropped, {} reordered; digest {:016x}",
            ms(self.stream),
            self.tokens.len(),
            ms(self.decode),
            self.tokens.len() as f64 / self.decode.as_secs_f64().max(1e-9),
            self.prefill_stalls,
            self.faults.0,
            self.faults.1,
            self.digest
        );
        let _ = write!(s, "  tokens: {}", tokens_json(&self.tokens));
        s
    }
}

impl PrefillReport {
    /// The report as JSON.
    pub fn to_json(&self) -> String {
        Json::new()
            .str("transport", self.transport)
            .int("prompt_tokens", u64::from(self.prompt_tokens))
            .int("kv_positions", u64::from(self.kv_positions))
            .int("kv_bytes", self.kv_bytes)
            .int("chunks", u64::from(self.chunks))
            .num("handshake_ms", ms(self.handshake))
            .num("compute_ms", ms(self.compute))
            .num("transfer_span_ms", ms(self.transfer_span))
            .num("transfer_busy_ms", ms(self.transfer_busy))
            .num("transfer_gb_per_s", gbps(self.kv_bytes, self.transfer_busy))
            .num("tail_ms", ms(self.tail))
            .int("window", u64::from(self.window))
            .int("max_in_flight", u64::from(self.max_in_flight))
            .int("credit_stalls", self.stalls)
            .int("retransmits", self.retransmits)
            .int("faults_dropped", self.faults.0)
            .int("faults_reordered", self.faults.1)
            .raw("staging", &placement_json(self.placement.as_ref()))
            .int("in_place_layers", u64::from(self.in_place_layers))
            .finish()
    }

    /// The report as text.
    pub fn to_text(&self) -> String {
        format!(
            "prefill[{}]: {} tokens, {:.2} MiB KV in {} chunks; compute {:.2} ms; transfer span {:.2} ms, busy {:.2} ms ({:.2} GB/s), tail after compute {:.2} ms; window {} (max in flight {}), credit stalls {}; retransmits {}; staging: {}, {} of the layers computed into it in place",
            self.transport,
            self.prompt_tokens,
            self.kv_bytes as f64 / (1 << 20) as f64,
            self.chunks,
            ms(self.compute),
            ms(self.transfer_span),
            ms(self.transfer_busy),
            gbps(self.kv_bytes, self.transfer_busy),
            ms(self.tail),
            self.window,
            self.max_in_flight,
            self.stalls,
            self.retransmits,
            placement_text(self.placement.as_ref()),
            self.in_place_layers
        )
    }
}
