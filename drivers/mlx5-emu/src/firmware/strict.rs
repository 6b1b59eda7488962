//! [`Strictness`]: the checks issue 26 added where the audit
//! (`shared/reference/mlx5-hw-audit.md`) found the emulator more lenient than a ConnectX, one
//! switch each, so a driver can be held to them one by one.
//!
//! `Strictness::strict()` turns every check on, `Strictness::legacy()` reproduces the emulator
//! as it was before them. The binary takes `--strict` (all on) and `--lenient <check>,…` (named
//! ones off, applied after `--strict` or the default); the state report lists them.

use std::fmt;

/// One switch per check; see [`CHECKS`] for what each refuses and the audit row it comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strictness {
    /// Row 1: CREATE_CQ/QP/MKEY are charged firmware pages (`FirmwareOptions::object_pages`);
    /// when the pages held are short the command is held (its entry stays hardware-owned)
    /// until a MANAGE_PAGES give covers the PAGE_REQUEST the firmware posted.
    pub page_requests: bool,
    /// Rows 4, 5: send doorbells' BlueFlame bodies are looked at: on a UC BAR0 a body is
    /// counted `bf_uncombined` (served as an 8-byte doorbell), and in both modes a body that is
    /// not the WQE the ring holds is counted `bf_interleaved`.
    pub blueflame: bool,
    /// Row 6: every modify of a UD QP carries `mtu` 1..=5 and `log_msg_max` within the cap;
    /// a UD send longer than the QP's MTU is a LOCAL_LENGTH error CQE.
    pub ud_mtu: bool,
    /// Row 12: a receive data segment with `byte_count` 0 means 2^31 bytes (the data-segment
    /// convention sends already follow).
    pub recv_zero_length: bool,
    /// Row 13: an EQ that overruns with `oi` clear is fatal: health syndrome 0x0c with `rfr`.
    pub eq_overrun_fatal: bool,
    /// Row 17: SET_HCA_CAP bytes beyond the capability structure must be zero, and
    /// QUERY_HCA_CAP fills them with a nonzero pattern.
    pub cap_payload: bool,
    /// Row 18: `cmd_interface_rev` reads 0 while `initializing` is set.
    pub cmdif_rev: bool,
    /// Row 19: CREATE_CQ's `pas[]` (from `inlen`) may not list more pages than the ring has.
    pub cq_pas: bool,
}

/// A check's name (for `--lenient` and the state report), its audit row(s) and what it does.
pub struct Check {
    /// The name, as `--lenient` takes it.
    pub name: &'static str,
    /// The audit rows it comes from.
    pub rows: &'static str,
    /// What it refuses or counts.
    pub what: &'static str,
    get: fn(&Strictness) -> bool,
    set: fn(&mut Strictness, bool),
}

impl fmt::Debug for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Check").field("name", &self.name).finish()
    }
}

macro_rules! checks {
    ($( $field:ident => $name:literal, $rows:literal, $what:literal; )*) => {
        /// Every check, in the order the state report lists them.
        pub const CHECKS: &[Check] = &[ $( Check {
            name: $name,
            rows: $rows,
            what: $what,
            get: |s| s.$field,
            set: |s, v| s.$field = v,
        }, )* ];

        impl Strictness {
            /// Every check on: the emulator as strict as it knows how to be.
            pub const fn strict() -> Strictness {
                Strictness { $( $field: true, )* }
            }

            /// Every check off: the emulator as it was before issue 26.
            pub const fn legacy() -> Strictness {
                Strictness { $( $field: false, )* }
            }
        }
    };
}

checks! {
    page_requests => "page-requests", "1",
        "object creation is charged firmware pages; short, the command waits for a PAGE_REQUEST to be answered";
    blueflame => "blueflame", "4, 5",
        "BlueFlame bodies are looked at: uncombined ones on a UC BAR0 counted, interleaved writes counted as errors";
    ud_mtu => "ud-mtu", "6",
        "UD modifies need mtu 1..=5 and log_msg_max within the cap; a UD send above the MTU is a length error";
    recv_zero_length => "recv-zero-length", "12",
        "a receive data segment with byte_count 0 means 2^31 bytes";
    eq_overrun_fatal => "eq-overrun", "13",
        "an EQ overrun with oi clear is fatal (health syndrome 0x0c, rfr)";
    cap_payload => "cap-payload", "17",
        "SET_HCA_CAP bytes past the structure must be zero; QUERY_HCA_CAP fills them with a pattern";
    cmdif_rev => "cmdif-rev", "18",
        "cmd_interface_rev reads 0 while the firmware is initializing";
    cq_pas => "cq-pas", "19",
        "CREATE_CQ may not list more pas[] pages than the ring has";
}

impl Default for Strictness {
    /// Every check on (issue 26: the emulator is as strict as the hardware,
    /// and rnic-mlx5 passes each check); `--lenient <check>` turns one off
    /// only to reproduce the old behaviour.
    fn default() -> Strictness {
        Strictness::strict()
    }
}

impl Strictness {
    /// The check called `name` (as [`CHECKS`] spells it).
    pub fn check(name: &str) -> Option<&'static Check> {
        CHECKS.iter().find(|c| c.name == name)
    }

    /// Whether check `c` is on.
    pub fn is_on(&self, c: &Check) -> bool {
        (c.get)(self)
    }

    /// Turn check `c` on or off.
    pub fn set(&mut self, c: &Check, on: bool) {
        (c.set)(self, on);
    }

    /// Turn off the checks named in `list` (comma-separated, as `--lenient` takes them).
    /// Unknown names are an error that lists the known ones.
    pub fn lenient(mut self, list: &str) -> Result<Strictness, String> {
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let Some(c) = Strictness::check(name) else {
                let known: Vec<&str> = CHECKS.iter().map(|c| c.name).collect();
                return Err(format!(
                    "unknown check {name:?}: the checks are {}",
                    known.join(", ")
                ));
            };
            self.set(c, false);
        }
        Ok(self)
    }

    /// (name, on) of every check, in [`CHECKS`] order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, bool)> + '_ {
        CHECKS.iter().map(|c| (c.name, self.is_on(c)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_and_legacy_are_all_on_and_all_off_and_names_round_trip() {
        assert!(Strictness::strict().iter().all(|(_, on)| on));
        assert!(Strictness::legacy().iter().all(|(_, on)| !on));
        assert_eq!(Strictness::default(), Strictness::strict());
        for c in CHECKS {
            let mut s = Strictness::legacy();
            s.set(c, true);
            assert_eq!(s.iter().filter(|(_, on)| *on).count(), 1, "{}", c.name);
            assert!(Strictness::check(c.name).is_some_and(|d| s.is_on(d)));
        }
        let s = Strictness::strict()
            .lenient("cap-payload, ud-mtu,")
            .unwrap();
        assert!(!s.cap_payload && !s.ud_mtu && s.eq_overrun_fatal && s.cq_pas);
        let e = Strictness::strict().lenient("sunburn").unwrap_err();
        assert!(e.contains("\"sunburn\"") && e.contains("ud-mtu"), "{e}");
    }

    #[test]
    fn every_check_is_documented_with_its_row() {
        let doc = include_str!("../../../../docs/mlx5-emu.md");
        for c in CHECKS {
            assert!(
                doc.contains(&format!("`{}`", c.name)),
                "check {} missing from docs/mlx5-emu.md",
                c.name
            );
        }
    }
}
