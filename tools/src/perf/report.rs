//! perftest's result tables (`perftest_parameters.h` `RESULT_*`/`REPORT_*`)
//! and the statistics behind them.

use serde_json::{Value, json};

/// perftest's separator line.
pub const RESULT_LINE: &str =
    "---------------------------------------------------------------------------------------";

/// Bandwidth header (`RESULT_FMT` / `RESULT_FMT_G`).
pub fn bw_header(gbits: bool) -> &'static str {
    if gbits {
        " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
    } else {
        " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
    }
}

/// Latency header (`RESULT_FMT_LAT`).
pub const LAT_HEADER: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ";

/// One bandwidth row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BwRow {
    /// Message size.
    pub bytes: u64,
    /// Completed messages (all QPs).
    pub iters: u64,
    /// Peak bandwidth in the report unit.
    pub bw_peak: f64,
    /// Average bandwidth in the report unit.
    pub bw_avg: f64,
    /// Million messages per second.
    pub msg_rate: f64,
}

/// Convert bytes over seconds to the report unit: MB/s (2^20, as perftest)
/// or Gb/s (10^9 bits).
pub fn bw_unit(bytes: f64, secs: f64, gbits: bool) -> f64 {
    if secs <= 0.0 {
        return 0.0;
    }
    if gbits {
        bytes * 8.0 / secs / 1e9
    } else {
        bytes / secs / f64::from(1u32 << 20)
    }
}

impl BwRow {
    /// The row as perftest prints it (`REPORT_FMT`).
    pub fn line(&self) -> String {
        format!(
            " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t   {:<7.6}",
            self.bytes, self.iters, self.bw_peak, self.bw_avg, self.msg_rate
        )
    }

    /// JSON object.
    pub fn json(&self, gbits: bool) -> Value {
        json!({
            "bytes": self.bytes,
            "iterations": self.iters,
            "bw_peak": self.bw_peak,
            "bw_average": self.bw_avg,
            "msg_rate_mpps": self.msg_rate,
            "unit": if gbits { "Gb/sec" } else { "MB/sec" },
        })
    }
}

/// One latency row (microseconds, already halved for one-way tests).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LatRow {
    /// Message size.
    pub bytes: u64,
    /// Iterations.
    pub iters: u64,
    /// Minimum.
    pub t_min: f64,
    /// Maximum.
    pub t_max: f64,
    /// Median.
    pub t_typical: f64,
    /// Mean.
    pub t_avg: f64,
    /// Standard deviation.
    pub t_stdev: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
}

impl LatRow {
    /// From per-iteration round trips in nanoseconds; `divisor` 2 reports
    /// one-way latency as half the round trip (write/send), 1 the round
    /// trip (read/atomic), as perftest's `rtt_factor`.
    pub fn from_samples(bytes: u64, samples_ns: &mut [u64], divisor: f64) -> LatRow {
        samples_ns.sort_unstable();
        let n = samples_ns.len();
        let us = |ns: u64| ns as f64 / 1000.0 / divisor;
        if n == 0 {
            return LatRow {
                bytes,
                iters: 0,
                t_min: 0.0,
                t_max: 0.0,
                t_typical: 0.0,
                t_avg: 0.0,
                t_stdev: 0.0,
                p99: 0.0,
                p999: 0.0,
            };
        }
        let avg = samples_ns.iter().map(|s| us(*s)).sum::<f64>() / n as f64;
        let var = samples_ns
            .iter()
            .map(|s| (us(*s) - avg).powi(2))
            .sum::<f64>()
            / n as f64;
        let pct = |p: f64| {
            let i = ((n as f64 * p).ceil() as usize)
                .saturating_sub(1)
                .min(n - 1);
            us(samples_ns[i])
        };
        LatRow {
            bytes,
            iters: n as u64,
            t_min: us(samples_ns[0]),
            t_max: us(samples_ns[n - 1]),
            t_typical: us(samples_ns[n / 2]),
            t_avg: avg,
            t_stdev: var.sqrt(),
            p99: pct(0.99),
            p999: pct(0.999),
        }
    }

    /// The row as perftest prints it (`REPORT_FMT_LAT`).
    pub fn line(&self) -> String {
        format!(
            " {:<7} {}          {:<7.2}        {:<7.2}      {:<7.2}  \t       {:<7.2}     \t{:<7.2}\t\t{:<7.2} \t\t{:<7.2}",
            self.bytes,
            self.iters,
            self.t_min,
            self.t_max,
            self.t_typical,
            self.t_avg,
            self.t_stdev,
            self.p99,
            self.p999
        )
    }

    /// JSON object.
    pub fn json(&self) -> Value {
        json!({
            "bytes": self.bytes,
            "iterations": self.iters,
            "t_min_us": self.t_min,
            "t_max_us": self.t_max,
            "t_typical_us": self.t_typical,
            "t_avg_us": self.t_avg,
            "t_stdev_us": self.t_stdev,
            "p99_us": self.p99,
            "p99_9_us": self.p999,
        })
    }
}

/// Peak bandwidth from completion times: the best window of `window`
/// consecutive completions (perftest uses the best single completion gap;
/// a window smooths the coarse batches a software backend completes in).
pub fn peak_bytes_per_sec(completion_ns: &[u64], bytes_each: u64, window: usize) -> f64 {
    let w = window.max(1);
    if completion_ns.len() <= w {
        return 0.0;
    }
    let best = completion_ns
        .windows(w + 1)
        .map(|s| s[w].saturating_sub(s[0]))
        .filter(|d| *d > 0)
        .min();
    best.map_or(0.0, |d| (w as u64 * bytes_each) as f64 / (d as f64 / 1e9))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn latency_statistics_are_ordered_and_halved() {
        let mut s: Vec<u64> = (1..=1000).map(|i| i * 1000).collect();
        let r = LatRow::from_samples(2, &mut s, 2.0);
        assert_eq!(r.iters, 1000);
        assert!((r.t_min - 0.5).abs() < 1e-9);
        assert!((r.t_max - 500.0).abs() < 1e-9);
        assert!((r.p99 - 495.0).abs() < 1e-9);
        assert!(
            r.t_min <= r.t_typical && r.t_typical <= r.p99 && r.p99 <= r.p999 && r.p999 <= r.t_max
        );
    }

    #[test]
    fn rows_match_perftest_columns() {
        let b = BwRow {
            bytes: 65536,
            iters: 5000,
            bw_peak: 1.5,
            bw_avg: 1.25,
            msg_rate: 0.02,
        };
        assert_eq!(
            b.line(),
            " 65536      5000             1.50               1.25   \t\t   0.020000"
        );
        let line = b.line();
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f, ["65536", "5000", "1.50", "1.25", "0.020000"]);
    }

    #[test]
    fn units() {
        assert!((bw_unit(1048576.0, 1.0, false) - 1.0).abs() < 1e-12);
        assert!((bw_unit(125_000_000.0, 1.0, true) - 1.0).abs() < 1e-12);
        let t: Vec<u64> = (0..10).map(|i| i * 1000).collect();
        assert!((peak_bytes_per_sec(&t, 1000, 1) - 1e9).abs() < 1.0);
    }
}
