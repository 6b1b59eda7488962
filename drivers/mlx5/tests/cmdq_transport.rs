//! The command queue over vfio-user against a scripted device: an
//! rnic-mlx5-emu shell whose doorbell handler (this file's [`Scripted`])
//! completes, swallows or corrupts commands on request. It checks the
//! transport — ownership, doorbell, slots, timeouts, hostile replies — apart
//! from any firmware logic (that is `bringup.rs`, against the emulator's
//! firmware).
#![allow(clippy::unwrap_used)]

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rnic_mlx5::{CmdQueue, CmdQueueOptions, Mlx5Error, PciFunction, VfioUserFunction};
use rnic_mlx5_emu::{Device, DoorbellHandler, Emulator, Options};
use rnic_mlx5_prm::{
    CmdOpcode, CmdStatus, DeliveryStatus, cmd_queue_entry, init_seg_offset, initial_seg,
};

/// What the scripted device does with the next command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Act {
    /// Complete with status OK.
    Answer,
    /// Never complete (ownership stays with the device).
    Swallow,
    /// Complete with this command status and syndrome.
    Fail(u8, u32),
    /// Complete with this delivery status.
    Deliver(u8),
    /// Complete with a different token.
    BadToken,
    /// Complete with a larger output length.
    BadOutLen,
}

#[derive(Default)]
struct Script {
    next: VecDeque<Act>,
    /// (slot, opcode, token) of every command seen.
    seen: Vec<(u32, u16, u8)>,
}

#[derive(Clone, Default)]
struct Scripted(Arc<Mutex<Script>>);

impl Scripted {
    fn push(&self, act: Act, times: usize) {
        let mut s = self.0.lock().unwrap();
        for _ in 0..times {
            s.next.push_back(act);
        }
    }
    fn seen(&self) -> Vec<(u32, u16, u8)> {
        self.0.lock().unwrap().seen.clone()
    }
}

fn cmdq_base(dev: &Device) -> u64 {
    let bar = dev.bar();
    let h = bar.read32_be(init_seg_offset::CMDQ_ADDR_H as u64);
    let l = bar.read32_be(init_seg_offset::CMDQ_ADDR_L_SZ as u64);
    (u64::from(h) << 32) | u64::from(initial_seg::cmdq_phy_addr_31_12.extract(l)) << 12
}

impl DoorbellHandler for Scripted {
    fn command_doorbell(&mut self, dev: &Device, bits: u32) {
        let base = cmdq_base(dev);
        let mut s = self.0.lock().unwrap();
        for slot in 0..32u32 {
            if bits & (1 << slot) == 0 {
                continue;
            }
            let at = base + u64::from(slot) * 64;
            let mut e = [0u8; 64];
            if dev.dma_read(at, &mut e).is_err() {
                continue;
            }
            let opcode = u16::from_be_bytes([e[0x10], e[0x11]]);
            let token_at = cmd_queue_entry::token.byte_offset();
            s.seen.push((slot, opcode, e[token_at]));
            let act = s.next.pop_front().unwrap_or(Act::Answer);
            let out = cmd_queue_entry::command_output_inline_data.byte_offset();
            let own = cmd_queue_entry::ownership.byte_offset();
            let mut status_own = 0u8;
            match act {
                Act::Swallow => continue,
                Act::Answer => {}
                Act::Fail(status, syndrome) => {
                    e[out] = status;
                    e[out + 4..out + 8].copy_from_slice(&syndrome.to_be_bytes());
                }
                Act::Deliver(code) => status_own = code << 1,
                Act::BadToken => e[token_at] = e[token_at].wrapping_add(1),
                Act::BadOutLen => {
                    let len = cmd_queue_entry::output_length.byte_offset();
                    e[len..len + 4].copy_from_slice(&0x4000u32.to_be_bytes());
                }
            }
            e[own] = status_own;
            dev.dma_write(at, &e[..own]).unwrap();
            dev.dma_write(at + own as u64, &[status_own]).unwrap();
        }
    }

    fn uar_doorbell(&mut self, _dev: &Device, _page: u32, _offset: u32, _value: u64) {}
}

struct Rig {
    emu: Emulator,
    script: Scripted,
    function: Arc<dyn PciFunction>,
    _dir: tempfile::TempDir,
}

fn rig() -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let path: PathBuf = dir.path().join("mlx5.sock");
    let script = Scripted::default();
    let options = Options {
        boot_delay: Duration::from_millis(5),
        ..Options::default()
    };
    let emu = Emulator::start_with(&path, options, Box::new(script.clone())).unwrap();
    let function: Arc<dyn PciFunction> = Arc::new(VfioUserFunction::connect(&path).unwrap());
    function.enable_bus_master().unwrap();
    Rig {
        emu,
        script,
        function,
        _dir: dir,
    }
}

fn nop(q: &CmdQueue) -> Result<Vec<u8>, Mlx5Error> {
    q.exec(CmdOpcode::Nop, 0, &[0u8; 16], 16)
}

#[test]
fn commands_complete_with_fresh_nonzero_tokens() {
    let r = rig();
    let q = CmdQueue::new(r.function.clone(), CmdQueueOptions::default()).unwrap();
    assert_eq!(q.slots(), 32);
    assert_eq!(
        q.timeout(),
        Duration::from_secs(60),
        "no cmd_exec_to: the default"
    );
    for _ in 0..300 {
        nop(&q).unwrap();
    }
    // A long command: input and output mailbox chains.
    let out = q
        .exec(CmdOpcode::Nop, 0, &vec![0u8; 0x1010], 0x1010)
        .unwrap();
    assert_eq!(out.len(), 0x1010);
    let seen = r.script.seen();
    assert_eq!(seen.len(), 301);
    assert!(
        seen.iter()
            .all(|&(slot, op, t)| slot == 0 && op == 0x80d && t != 0)
    );
    for w in seen.windows(2) {
        assert_ne!(w[0].2, w[1].2, "token changes per command");
    }
    assert_eq!(q.executed(), 301);
    // The queue page is where the driver said.
    assert_eq!(cmdq_base(r.emu.device()), q.page_iova().get());
}

#[test]
fn statuses_and_hostile_replies_are_typed_and_leave_the_queue_usable() {
    let r = rig();
    let q = CmdQueue::new(r.function.clone(), CmdQueueOptions::default()).unwrap();
    r.script.push(Act::Fail(0x02, 0xdead_beef), 1);
    let err = nop(&q).unwrap_err();
    assert!(
        matches!(
            err,
            Mlx5Error::Command {
                opcode: CmdOpcode::Nop,
                status: CmdStatus::BadOp,
                syndrome: 0xdead_beef,
                ..
            }
        ),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("BAD_OP") && text.contains("0xdeadbeef"),
        "{text}"
    );

    r.script.push(Act::Fail(0x50, 1), 1);
    assert!(matches!(
        nop(&q),
        Err(Mlx5Error::Command {
            status: CmdStatus::BadInpLen,
            ..
        })
    ));
    r.script.push(Act::Deliver(0x07), 1);
    let err = nop(&q).unwrap_err();
    assert!(
        matches!(
            err,
            Mlx5Error::Delivery {
                status: DeliveryStatus::InputLenErr,
                ..
            }
        ),
        "{err}"
    );
    // Audit row 14: fields the kernel does not check (K core/cmd.c:307-330)
    // are counted, the command succeeds with the driver's own output length.
    r.script.push(Act::BadToken, 1);
    assert_eq!(q.reply_mismatches(), 0);
    nop(&q).unwrap();
    assert_eq!(q.reply_mismatches(), 1);
    r.script.push(Act::BadOutLen, 1);
    let out = q.exec(CmdOpcode::Nop, 0, &[0u8; 16], 0x100).unwrap();
    assert_eq!(out.len(), 0x100, "never the device's 0x4000");
    assert_eq!(q.reply_mismatches(), 2);
    // Still usable, same slot.
    nop(&q).unwrap();
    assert!(r.script.seen().iter().all(|s| s.0 == 0));
    // Caller mistakes are refused before anything is posted.
    let before = r.script.seen().len();
    assert!(matches!(
        q.exec(CmdOpcode::Nop, 0, &[0u8; 4], 16),
        Err(Mlx5Error::CommandInput { .. })
    ));
    assert!(matches!(
        q.exec(CmdOpcode::Nop, 0, &[0u8; 16], 2),
        Err(Mlx5Error::CommandInput { .. })
    ));
    assert_eq!(r.script.seen().len(), before);
}

#[test]
fn a_timed_out_slot_stays_reserved_until_the_device_returns_it() {
    let r = rig();
    let q = CmdQueue::new(
        r.function.clone(),
        CmdQueueOptions {
            timeout: Some(Duration::from_millis(100)),
        },
    )
    .unwrap();
    r.script.push(Act::Swallow, 1);
    let start = Instant::now();
    let err = nop(&q).unwrap_err();
    assert!(start.elapsed() >= Duration::from_millis(100));
    assert!(
        matches!(
            err,
            Mlx5Error::CommandTimeout {
                opcode: CmdOpcode::Nop,
                slot: 0,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("reset the function"), "{err}");
    assert_eq!(q.stuck_slots(), 1);
    // The next command goes to slot 1.
    nop(&q).unwrap();
    assert_eq!(r.script.seen().last().unwrap().0, 1);

    // The device finishes the swallowed command late: slot 0 comes back.
    let own = cmd_queue_entry::ownership.byte_offset() as u64;
    let base = cmdq_base(r.emu.device());
    r.emu.device().dma_write(base + own, &[0]).unwrap();
    assert_eq!(q.stuck_slots(), 0);
    nop(&q).unwrap();
    assert_eq!(r.script.seen().last().unwrap().0, 0);

    // Every regular slot swallowed: a clear error, nothing posted. Slot 31
    // is MANAGE_PAGES' alone (K max_reg_cmds; audit row 1).
    assert_eq!(q.page_slot(), Some(31));
    r.script.push(Act::Swallow, 31);
    for slot in 0..31 {
        assert!(matches!(
            nop(&q),
            Err(Mlx5Error::CommandTimeout { slot: s, .. }) if s == slot
        ));
    }
    let posted = r.script.seen().len();
    let err = nop(&q).unwrap_err();
    assert!(
        matches!(err, Mlx5Error::NoCommandSlot { slots: 32, .. }),
        "{err}"
    );
    assert_eq!(r.script.seen().len(), posted);
}

/// Audit row 1: firmware may hold a regular command until the page request it
/// raised is answered (K core/cmd.c:1015-1053, core/pagealloc.c:700-776; RC
/// mlx5_vfio.c:514-556). With main's single lock held for the whole wait, the
/// MANAGE_PAGES below could not be posted until the NOP timed out; here it
/// goes out on the reserved slot 31 and completes while slot 0 is still
/// outstanding.
#[test]
fn manage_pages_runs_on_the_reserved_slot_while_a_regular_command_waits() {
    let r = rig();
    let q = Arc::new(
        CmdQueue::new(
            r.function.clone(),
            CmdQueueOptions {
                timeout: Some(Duration::from_secs(3)),
            },
        )
        .unwrap(),
    );
    r.script.push(Act::Swallow, 1);
    let waiting = {
        let q = q.clone();
        std::thread::spawn(move || nop(&q))
    };
    while r.script.seen().is_empty() {
        std::thread::sleep(Duration::from_millis(1));
    }
    let start = Instant::now();
    let mut take = vec![0u8; 16];
    take[12..16].copy_from_slice(&0u32.to_be_bytes());
    q.exec(CmdOpcode::ManagePages, 0, &take, 16).unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "MANAGE_PAGES waited for the held command: {:?}",
        start.elapsed()
    );
    let seen = r.script.seen();
    assert_eq!(seen[0].0, 0, "the held NOP on slot 0");
    assert_eq!(
        (seen[1].0, seen[1].1),
        (31, 0x108),
        "MANAGE_PAGES on slot 31"
    );
    // The firmware now completes the held command: the waiter gets it.
    let own = cmd_queue_entry::ownership.byte_offset() as u64;
    r.emu
        .device()
        .dma_write(cmdq_base(r.emu.device()) + own, &[0])
        .unwrap();
    waiting.join().unwrap().unwrap();
    // A regular command never takes slot 31, even with slots stuck.
    assert!(r.script.seen().iter().all(|s| s.1 == 0x108 || s.0 != 31));
}
