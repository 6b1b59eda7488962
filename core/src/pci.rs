//! PCI function addresses (`domain:bus:device.function`).

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

/// A PCI function address as sysfs names it: `0000:3b:00.1`.
///
/// Parsing also accepts the short form `3b:00.1` (domain 0), as `lspci` prints it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddr {
    /// PCI segment (domain), 16 bits.
    pub domain: u16,
    /// Bus number.
    pub bus: u8,
    /// Device number, 0..=31.
    pub device: u8,
    /// Function number, 0..=7.
    pub function: u8,
}

/// A string that is not a PCI address.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error(
    "{input:?} is not a PCI address: {reason} (expected DDDD:BB:DD.F, e.g. 0000:3b:00.1, as `lspci -D` prints it)"
)]
pub struct PciAddrError {
    /// What was given.
    pub input: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl PciAddr {
    /// A PCI address, checking the device (5 bits) and function (3 bits) ranges.
    pub fn new(domain: u16, bus: u8, device: u8, function: u8) -> Result<PciAddr, PciAddrError> {
        let addr = PciAddr {
            domain,
            bus,
            device,
            function,
        };
        if device > 31 {
            return Err(PciAddrError {
                input: addr.to_string(),
                reason: "device number is above 31",
            });
        }
        if function > 7 {
            return Err(PciAddrError {
                input: addr.to_string(),
                reason: "function number is above 7",
            });
        }
        Ok(addr)
    }
}

impl fmt::Display for PciAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

impl FromStr for PciAddr {
    type Err = PciAddrError;

    fn from_str(s: &str) -> Result<PciAddr, PciAddrError> {
        let err = |reason| PciAddrError {
            input: s.to_owned(),
            reason,
        };
        let (head, function) = s
            .rsplit_once('.')
            .ok_or_else(|| err("missing '.F' function part"))?;
        let mut parts: Vec<&str> = head.split(':').collect();
        let (domain, bus, device) = match parts.len() {
            3 => (parts.remove(0), parts.remove(0), parts.remove(0)),
            2 => ("0", parts.remove(0), parts.remove(0)),
            _ => return Err(err("expected DDDD:BB:DD.F or BB:DD.F")),
        };
        let hex = |t: &str, max_digits: usize, what| {
            if t.is_empty() || t.len() > max_digits {
                return Err(err(what));
            }
            u32::from_str_radix(t, 16).map_err(|_| err(what))
        };
        let domain = hex(domain, 4, "domain is not 1-4 hex digits")?;
        let bus = hex(bus, 2, "bus is not 1-2 hex digits")?;
        let device = hex(device, 2, "device is not 1-2 hex digits")?;
        let function = hex(function, 1, "function is not one hex digit")?;
        PciAddr::new(domain as u16, bus as u8, device as u8, function as u8)
            .map_err(|e| err(e.reason))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_display() {
        let a: PciAddr = "0000:3b:00.1".parse().expect("parse");
        assert_eq!(
            a,
            PciAddr {
                domain: 0,
                bus: 0x3b,
                device: 0,
                function: 1
            }
        );
        assert_eq!(a.to_string(), "0000:3b:00.1");
        assert_eq!("3b:00.1".parse::<PciAddr>(), Ok(a));
        assert_eq!(
            "0001:AF:1f.7".parse::<PciAddr>().map(|a| a.to_string()),
            Ok("0001:af:1f.7".to_owned())
        );
    }

    #[test]
    fn rejects_bad_addresses() {
        for bad in [
            "",
            "3b:00",
            "0000:3b:20.0",
            "0000:3b:00.8",
            "x:3b:00.0",
            "00000:3b:00.0",
            "0000:3b:00:00.0",
            "0000:3b:00.10",
        ] {
            assert!(bad.parse::<PciAddr>().is_err(), "accepted {bad:?}");
        }
        let e = "0000:3b:20.0".parse::<PciAddr>().expect_err("device 0x20");
        assert!(e.to_string().contains("lspci -D"), "{e}");
    }
}
