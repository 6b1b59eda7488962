//! Reading the emulator's one-line JSON state report (`--state-file`) in the
//! tests that run the binary. Included by path (`binary.rs`,
//! `crash_recovery.rs`, `keep_state.rs`).
#![allow(dead_code)]

use std::path::Path;
use std::time::{Duration, Instant};

/// The value of `"key":` in a one-line JSON report, after `from` (the text
/// up to the next `,` or `}`): enough for the flat objects of the report.
pub fn field<'a>(json: &'a str, from: &str, key: &str) -> &'a str {
    let at = json
        .find(from)
        .unwrap_or_else(|| panic!("{from} not in {json}"));
    let rest = &json[at..];
    let k = format!("\"{key}\":");
    let v = &rest[rest
        .find(&k)
        .unwrap_or_else(|| panic!("{key} not in {rest}"))
        + k.len()..];
    &v[..v.find([',', '}']).unwrap()]
}

/// [`field`] as a number.
pub fn num(json: &str, from: &str, key: &str) -> u64 {
    field(json, from, key)
        .parse()
        .unwrap_or_else(|e| panic!("{key}: {e}: {json}"))
}

/// The state report once `connections` reached `n` (panics after 15 s).
pub fn state_after(path: &Path, n: u64) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Ok(s) = std::fs::read_to_string(path)
            && s.contains("\"connections\":")
            && num(&s, "{", "connections") >= n
        {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "no report of {n} connections: {:?}",
            std::fs::read_to_string(path)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
