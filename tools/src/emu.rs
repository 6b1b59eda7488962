//! `rnicctl emu …`: start, list and stop emulated ConnectX functions
//! (`rnic-mlx5-emu` processes), each on its own vfio-user socket.
//!
//! Every emulator has a name and lives in the *emulator directory*
//! (`--dir`, else `$RNIC_EMU_DIR`, else `/run/rnic/emu` as root, else
//! `$XDG_RUNTIME_DIR/rnic/emu`, else `/tmp/rnic-<uid>/emu`):
//!
//! * `<name>.sock` — its socket (unless `--socket` put it elsewhere);
//! * `<name>.json` — rnicctl's record: name, pid, socket, spec, binary,
//!   arguments, log;
//! * `<name>.state.json` — the emulator's own `--state-file` report (pages,
//!   objects, DMA mappings, what the last driver left behind);
//! * `<name>.ctl` — its control socket (`--control`: fault hooks and the
//!   live state, one request a line; `rnicctl emu fault` forwards one);
//! * `<name>.log` — its stderr.
//!
//! An emulator is *alive* while its pid is a running `rnic-mlx5-emu` (not a
//! zombie, not a reused pid) and its socket exists; otherwise *stale*, and
//! `list` removes its files.

use std::fs;
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

/// The emulator binary's name.
const BIN: &str = "rnic-mlx5-emu";
/// The variable naming the emulator binary (before the lookup next to rnicctl and in PATH).
const BIN_ENV: &str = "RNIC_MLX5_EMU";
/// The variable naming the emulator directory.
const DIR_ENV: &str = "RNIC_EMU_DIR";
/// What a UNIX socket path may hold (sun_path, less its NUL).
const MAX_SOCKET_PATH: usize = 107;

/// Why an `emu` command failed; each says what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EmuError {
    /// The emulator binary is nowhere to be found.
    #[error(
        "{BIN} not found (looked at ${BIN_ENV}, next to rnicctl in {beside} and in PATH): build it \
         with `cargo build -p rnic-mlx5-emu` (it lands next to rnicctl in target/<profile>/), \
         install it in PATH, or set {BIN_ENV}=/path/to/{BIN}"
    )]
    BinaryNotFound {
        /// rnicctl's own directory.
        beside: String,
    },
    /// The name is taken by a running emulator.
    #[error(
        "an emulator named {name} is already running (pid {pid}, {socket}): pick another --name, \
         or `rnicctl emu stop {name}` first"
    )]
    NameInUse {
        /// The name.
        name: String,
        /// Its pid.
        pid: i32,
        /// Its socket.
        socket: String,
    },
    /// A name that is not a plain file name.
    #[error("bad emulator name {0:?}: use letters, digits, '-', '_' and '.' (not first)")]
    BadName(String),
    /// A flag rnicctl sets itself was passed through.
    #[error(
        "{0} is set by `rnicctl emu start` itself: use `rnicctl emu start --socket PATH` (the state \
         file is <name>.state.json in the emulator directory)"
    )]
    ManagedFlag(String),
    /// The socket path does not fit a sockaddr_un.
    #[error(
        "socket path {path} is {len} bytes; UNIX sockets allow {MAX_SOCKET_PATH}: pick a shorter \
         --socket or --dir"
    )]
    SocketPathTooLong {
        /// The path.
        path: String,
        /// Its length.
        len: usize,
    },
    /// The emulator exited before it listened.
    #[error("{BIN} exited at start ({status}): {last}\n(full log: {log})")]
    StartFailed {
        /// Its exit status.
        status: String,
        /// The last lines of its log.
        last: String,
        /// The log file.
        log: String,
    },
    /// The emulator did not listen in time.
    #[error(
        "{BIN} (pid {pid}) did not listen on {socket} within {secs} s: see its log {log}; it was \
         killed"
    )]
    StartTimeout {
        /// Its pid.
        pid: u32,
        /// The socket.
        socket: String,
        /// Seconds waited.
        secs: u64,
        /// The log file.
        log: String,
    },
    /// No emulator of that name.
    #[error("no emulator named {name} in {dir} (`rnicctl emu list` shows them)")]
    NoSuch {
        /// The name.
        name: String,
        /// The emulator directory.
        dir: String,
    },
    /// An emulator started without a control socket (by an older rnicctl).
    #[error(
        "emulator {0} has no control socket (started by an older rnicctl): restart it with \
         `rnicctl emu stop {0} && rnicctl emu start --name {0}`"
    )]
    NoControl(String),
    /// The emulator refused a fault request.
    #[error("the emulator refused the request: {0}")]
    Refused(String),
    /// The control socket's reply was not the JSON it should be.
    #[error("the emulator's control socket replied {0:?}, not a JSON reply")]
    BadReply(String),
    /// `stop` without a name.
    #[error("stop what? name an emulator (`rnicctl emu list`) or say --all")]
    NothingToStop,
    /// A file or directory step failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// The step.
        what: &'static str,
        /// The path.
        path: String,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// A signal could not be sent.
    #[error("sending {signal} to pid {pid}: {source}")]
    Signal {
        /// The signal.
        signal: Signal,
        /// The process.
        pid: i32,
        /// Cause.
        #[source]
        source: Errno,
    },
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> EmuError + use<> {
    let path = path.display().to_string();
    move |source| EmuError::Io { what, path, source }
}

/// `rnicctl emu`: the emulator directory and a subcommand.
#[derive(Args, Debug)]
pub struct EmuArgs {
    /// The emulator directory: sockets, records, state reports and logs
    /// (default $RNIC_EMU_DIR, else /run/rnic/emu as root, else
    /// $XDG_RUNTIME_DIR/rnic/emu, else /tmp/rnic-<uid>/emu).
    #[arg(long, global = true, value_name = "DIR")]
    dir: Option<PathBuf>,
    #[command(subcommand)]
    cmd: EmuCmd,
}

/// The `emu` subcommands.
#[derive(Subcommand, Debug)]
enum EmuCmd {
    /// Start an emulated ConnectX-5 function (a detached rnic-mlx5-emu).
    ///
    /// Runs the rnic-mlx5-emu binary ($RNIC_MLX5_EMU, else the one next to
    /// rnicctl, else PATH) in its own session, its stderr in <dir>/<name>.log,
    /// its state report in <dir>/<name>.state.json; waits until it listens and
    /// prints the device spec to open it with (`mlx5:vfio-user:<socket>`).
    /// Emulator flags go after `--`, e.g. `rnicctl emu start -- --boot-pages
    /// 64 --once` (`rnic-mlx5-emu --help` lists them). It serves driver after
    /// driver, resetting the function between them (a driver that died
    /// included), until `rnicctl emu stop`.
    Start {
        /// Its name (default: the first free emu0, emu1, …).
        #[arg(long)]
        name: Option<String>,
        /// Its socket (default <dir>/<name>.sock).
        #[arg(long, value_name = "PATH")]
        socket: Option<PathBuf>,
        /// Seconds to wait for it to listen.
        #[arg(long, value_name = "S", default_value_t = 10)]
        timeout: u64,
        /// Print the record as JSON.
        #[arg(long)]
        json: bool,
        /// Flags for rnic-mlx5-emu (after `--`).
        #[arg(last = true, value_name = "EMULATOR FLAGS")]
        emu_args: Vec<String>,
    },
    /// List the emulators: name, pid, alive/stale, drivers served, socket, spec.
    ///
    /// Stale entries (the process is gone, or its socket is) are shown once
    /// and their files removed.
    List {
        /// Print JSON (each entry with the emulator's state report).
        #[arg(long)]
        json: bool,
    },
    /// Send one request to an emulator's control socket and print its JSON reply.
    ///
    /// Requests: `state`, `fail-next <OPCODE> <STATUS> <syndrome>`,
    /// `swallow-next [<OPCODE>]`, `delay-next [<OPCODE>] <ms>`,
    /// `error-cqe <qpn|any> <SYNDROME> [vendor]`, `error-cqe-recv …`,
    /// `health <SYNDROME> [rfr]`, `health-warn <SYNDROME>`, `health-stop`,
    /// `nic-state disabled|sw-reset`, `link up|down`, `pages <+N|-N>`,
    /// `take-zero <N>`, `rewrite-reply tokens|blocks|entry|all`, `clear`,
    /// `help` (docs/mlx5-emu.md, "Control socket"). Exits nonzero when the
    /// emulator refuses it.
    Fault {
        /// The emulator.
        name: String,
        /// The request, e.g. `fail-next ALLOC_PD EXCEED_LIM 0x1234`.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        request: Vec<String>,
        /// Seconds to wait for the reply.
        #[arg(long, value_name = "S", default_value_t = 10)]
        timeout: u64,
    },
    /// Stop emulators: SIGTERM, wait for the socket to go, SIGKILL after --timeout.
    ///
    /// A stopped emulator removes its socket and exits 0 (a connected driver
    /// sees its connection close). One that has not gone within the timeout
    /// is killed with SIGKILL and its socket removed here. Its files go too.
    Stop {
        /// The emulators to stop.
        names: Vec<String>,
        /// Stop every emulator in the directory.
        #[arg(long, conflicts_with = "names")]
        all: bool,
        /// Seconds to wait after SIGTERM before SIGKILL.
        #[arg(long, value_name = "S", default_value_t = 5)]
        timeout: u64,
    },
}

/// rnicctl's record of one emulator (`<dir>/<name>.json`).
#[derive(Debug, Clone)]
struct Record {
    name: String,
    pid: i32,
    socket: PathBuf,
    /// Its control socket (`None` in records of older rnicctls).
    control: Option<PathBuf>,
    binary: PathBuf,
    args: Vec<String>,
}

impl Record {
    fn spec(&self) -> String {
        format!("mlx5:vfio-user:{}", self.socket.display())
    }

    fn to_json(&self, dir: &Path) -> Value {
        json!({
            "name": self.name,
            "pid": self.pid,
            "socket": self.socket.display().to_string(),
            "spec": self.spec(),
            "control": self.control.as_ref().map(|c| c.display().to_string()),
            "binary": self.binary.display().to_string(),
            "args": self.args,
            "state_file": state_path(dir, &self.name).display().to_string(),
            "log": log_path(dir, &self.name).display().to_string(),
        })
    }

    fn from_json(v: &Value) -> Option<Record> {
        Some(Record {
            name: v["name"].as_str()?.to_owned(),
            pid: i32::try_from(v["pid"].as_i64()?).ok()?,
            socket: PathBuf::from(v["socket"].as_str()?),
            control: v["control"].as_str().map(PathBuf::from),
            binary: PathBuf::from(v["binary"].as_str()?),
            args: v["args"]
                .as_array()?
                .iter()
                .filter_map(|a| a.as_str().map(str::to_owned))
                .collect(),
        })
    }
}

fn record_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.json"))
}
fn state_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.state.json"))
}
fn control_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.ctl"))
}
fn log_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.log"))
}

/// The emulator directory (see the module docs).
fn emu_dir(cli: Option<&Path>) -> PathBuf {
    if let Some(d) = cli {
        return d.to_path_buf();
    }
    if let Some(d) = std::env::var_os(DIR_ENV).filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if nix::unistd::geteuid().is_root() {
        return PathBuf::from("/run/rnic/emu");
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return Path::new(&d).join("rnic/emu");
    }
    PathBuf::from(format!("/tmp/rnic-{}/emu", nix::unistd::getuid()))
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// The emulator binary: `$RNIC_MLX5_EMU`, next to this executable, in PATH.
fn find_binary() -> Result<PathBuf, EmuError> {
    if let Some(p) = std::env::var_os(BIN_ENV).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok();
    let beside = exe.as_deref().and_then(Path::parent);
    if let Some(p) = beside.map(|d| d.join(BIN)).filter(|p| is_executable(p)) {
        return Ok(p);
    }
    if let Some(path) = std::env::var_os("PATH") {
        for d in std::env::split_paths(&path) {
            let p = d.join(BIN);
            if is_executable(&p) {
                return Ok(p);
            }
        }
    }
    Err(EmuError::BinaryNotFound {
        beside: beside.map_or_else(|| "?".to_owned(), |d| d.display().to_string()),
    })
}

fn is_executable(p: &Path) -> bool {
    fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Whether `pid` is a live (not zombie) rnic-mlx5-emu serving `socket`.
fn is_our_emulator(pid: i32, socket: &Path) -> bool {
    if pid <= 0 {
        return false;
    }
    match kill(Pid::from_raw(pid), None) {
        Ok(()) | Err(Errno::EPERM) => {}
        Err(_) => return false,
    }
    // A zombie (its parent has not reaped it yet) has exited.
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    if let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r.trim_start())
        && (rest.starts_with('Z') || rest.starts_with('X'))
    {
        return false;
    }
    // Not a reused pid: its command line is ours.
    let Ok(cmdline) = fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let mut argv = cmdline.split(|&b| b == 0);
    let argv0_ok = argv
        .next()
        .is_some_and(|a| Path::new(std::str::from_utf8(a).unwrap_or("")).ends_with(BIN));
    let sock = socket.as_os_str().as_encoded_bytes();
    argv0_ok && argv.any(|a| a == sock)
}

fn socket_exists(p: &Path) -> bool {
    fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_socket())
}

/// Every record in `dir` (unreadable ones reported on stderr and skipped).
fn records(dir: &Path) -> Result<Vec<Record>, EmuError> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err("reading", dir)(e)),
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let file = e.file_name();
        let Some(f) = file.to_str() else { continue };
        let Some(name) = f.strip_suffix(".json") else {
            continue;
        };
        if name.ends_with(".state") || !valid_name(name) {
            continue;
        }
        match read_record(dir, name) {
            Ok(r) => out.push(r),
            Err(why) => eprintln!("rnicctl: skipping {}: {why}", e.path().display()),
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

fn read_record(dir: &Path, name: &str) -> Result<Record, String> {
    let p = record_path(dir, name);
    let text = fs::read_to_string(&p).map_err(|e| e.to_string())?;
    let v: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    Record::from_json(&v).ok_or_else(|| "not an rnicctl emulator record".to_owned())
}

/// Remove an emulator's files (the socket only when nothing serves it).
fn remove_files(dir: &Path, r: &Record) {
    for p in [
        record_path(dir, &r.name),
        state_path(dir, &r.name),
        log_path(dir, &r.name),
    ] {
        let _ = fs::remove_file(p);
    }
    if !is_our_emulator(r.pid, &r.socket) {
        for s in std::iter::once(&r.socket).chain(&r.control) {
            if socket_exists(s) {
                let _ = fs::remove_file(s);
            }
        }
    }
}

/// Runs one `emu` subcommand.
pub fn main(a: &EmuArgs) -> Result<(), EmuError> {
    let dir = emu_dir(a.dir.as_deref());
    match &a.cmd {
        EmuCmd::Start {
            name,
            socket,
            timeout,
            json,
            emu_args,
        } => start(
            &dir,
            name.as_deref(),
            socket.as_deref(),
            emu_args,
            Duration::from_secs(*timeout),
            *json,
        ),
        EmuCmd::List { json } => list(&dir, *json),
        EmuCmd::Fault {
            name,
            request,
            timeout,
        } => fault(&dir, name, request, Duration::from_secs(*timeout)),
        EmuCmd::Stop {
            names,
            all,
            timeout,
        } => stop(&dir, names, *all, Duration::from_secs(*timeout)),
    }
}

fn start(
    dir: &Path,
    name: Option<&str>,
    socket: Option<&Path>,
    emu_args: &[String],
    timeout: Duration,
    json: bool,
) -> Result<(), EmuError> {
    for a in emu_args {
        let flag = a.split('=').next().unwrap_or(a);
        if matches!(flag, "--socket" | "--state-file" | "--control") {
            return Err(EmuError::ManagedFlag(flag.to_owned()));
        }
    }
    let binary = find_binary()?;
    fs::create_dir_all(dir).map_err(io_err("creating", dir))?;
    let existing = records(dir)?;
    let name = match name {
        Some(n) if !valid_name(n) => return Err(EmuError::BadName(n.to_owned())),
        Some(n) => n.to_owned(),
        None => (0..)
            .map(|i| format!("emu{i}"))
            .find(|n| {
                !existing
                    .iter()
                    .any(|r| &r.name == n && is_our_emulator(r.pid, &r.socket))
            })
            .unwrap_or_else(|| "emu".to_owned()),
    };
    if let Some(r) = existing.iter().find(|r| r.name == name) {
        if is_our_emulator(r.pid, &r.socket) {
            return Err(EmuError::NameInUse {
                name,
                pid: r.pid,
                socket: r.socket.display().to_string(),
            });
        }
        remove_files(dir, r);
    }
    let socket = match socket {
        Some(s) => std::path::absolute(s).map_err(io_err("resolving", s))?,
        None => std::path::absolute(dir.join(format!("{name}.sock")))
            .map_err(io_err("resolving", dir))?,
    };
    let control =
        std::path::absolute(control_path(dir, &name)).map_err(io_err("resolving", dir))?;
    for s in [&socket, &control] {
        let len = s.as_os_str().len();
        if len > MAX_SOCKET_PATH {
            return Err(EmuError::SocketPathTooLong {
                path: s.display().to_string(),
                len,
            });
        }
    }
    if let Some(parent) = socket.parent() {
        fs::create_dir_all(parent).map_err(io_err("creating", parent))?;
    }
    let state = state_path(dir, &name);
    let _ = fs::remove_file(&state);
    let log = log_path(dir, &name);
    let log_file = fs::File::create(&log).map_err(io_err("creating", &log))?;

    let mut args = vec![
        "--socket".to_owned(),
        socket.display().to_string(),
        "--state-file".to_owned(),
        std::path::absolute(&state)
            .map_err(io_err("resolving", &state))?
            .display()
            .to_string(),
        "--control".to_owned(),
        control.display().to_string(),
    ];
    args.extend(emu_args.iter().cloned());
    let mut child = Command::new(&binary)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file)
        // Its own process group: a Ctrl-C at rnicctl's terminal is not its.
        .process_group(0)
        .spawn()
        .map_err(io_err("starting", &binary))?;
    let pid = child.id();
    // Listening: the emulator writes its state file (with its pid) right
    // after its socket listens. (Connecting to check would count as a driver.)
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(st) = child.try_wait().map_err(io_err("waiting for", &binary))? {
            return Err(EmuError::StartFailed {
                status: st.to_string(),
                last: log_tail(&log),
                log: log.display().to_string(),
            });
        }
        let ready = fs::read_to_string(&state).is_ok_and(|s| {
            serde_json::from_str::<Value>(&s).is_ok_and(|v| v["pid"].as_u64() == Some(pid.into()))
        });
        if ready && socket_exists(&socket) {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(EmuError::StartTimeout {
                pid,
                socket: socket.display().to_string(),
                secs: timeout.as_secs(),
                log: log.display().to_string(),
            });
        }
        thread::sleep(Duration::from_millis(10));
    }
    let record = Record {
        name,
        pid: i32::try_from(pid).unwrap_or(i32::MAX),
        socket,
        control: Some(control),
        binary,
        args: emu_args.to_vec(),
    };
    let rp = record_path(dir, &record.name);
    let mut text = record.to_json(dir).to_string();
    text.push('\n');
    fs::write(&rp, text).map_err(io_err("writing", &rp))?;
    if json {
        println!("{}", record.to_json(dir));
    } else {
        println!(
            "{} started (pid {}), serving {}; log {}",
            record.name,
            record.pid,
            record.socket.display(),
            log.display()
        );
        println!("spec: {}", record.spec());
        println!("stop: rnicctl emu stop {}", record.name);
    }
    // The child runs on; its exit is reaped by whoever adopts it.
    drop(child);
    Ok(())
}

/// `rnicctl emu fault NAME REQUEST…`: one request, its reply on stdout.
fn fault(dir: &Path, name: &str, request: &[String], timeout: Duration) -> Result<(), EmuError> {
    if !valid_name(name) {
        return Err(EmuError::BadName(name.to_owned()));
    }
    let r = read_record(dir, name).map_err(|_| EmuError::NoSuch {
        name: name.to_owned(),
        dir: dir.display().to_string(),
    })?;
    let Some(control) = r.control else {
        return Err(EmuError::NoControl(name.to_owned()));
    };
    let reply = ask(&control, &request.join(" "), timeout).map_err(io_err("asking", &control))?;
    println!("{reply}");
    let v: Value = serde_json::from_str(&reply).map_err(|_| EmuError::BadReply(reply.clone()))?;
    match v["ok"].as_bool() {
        Some(true) => Ok(()),
        Some(false) => Err(EmuError::Refused(
            v["error"]
                .as_str()
                .unwrap_or("(no reason given)")
                .to_owned(),
        )),
        None => Err(EmuError::BadReply(reply)),
    }
}

/// One request line to a control socket; its reply line (without the newline).
fn ask(control: &Path, line: &str, timeout: Duration) -> io::Result<String> {
    let mut s = UnixStream::connect(control)?;
    s.set_read_timeout(Some(timeout.max(Duration::from_millis(1))))?;
    s.set_write_timeout(Some(timeout.max(Duration::from_millis(1))))?;
    // One line: a newline inside an argument would be a second request.
    let line = line.replace(['\n', '\r'], " ");
    s.write_all(format!("{line}\n").as_bytes())?;
    let mut reply = String::new();
    BufReader::new(s).read_line(&mut reply)?;
    if !reply.ends_with('\n') {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the emulator closed the connection without a reply",
        ));
    }
    reply.truncate(reply.trim_end().len());
    Ok(reply)
}

/// The last three non-empty lines of a log file.
fn log_tail(path: &Path) -> String {
    let mut text = String::new();
    if let Ok(mut f) = fs::File::open(path) {
        let len = f.metadata().map_or(0, |m| m.len());
        let _ = f.seek(SeekFrom::Start(len.saturating_sub(4096)));
        let _ = f.read_to_string(&mut text);
    }
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(3)..].join("\n");
    if tail.is_empty() {
        "(nothing logged)".to_owned()
    } else {
        tail
    }
}

fn list(dir: &Path, json: bool) -> Result<(), EmuError> {
    let mut rows = Vec::new();
    for r in records(dir)? {
        let alive = is_our_emulator(r.pid, &r.socket) && socket_exists(&r.socket);
        let state: Value = fs::read_to_string(state_path(dir, &r.name))
            .ok()
            .and_then(|s| serde_json::from_str(&s).ok())
            .unwrap_or(Value::Null);
        if !alive {
            remove_files(dir, &r);
        }
        rows.push((r, alive, state));
    }
    if json {
        let v: Vec<Value> = rows
            .iter()
            .map(|(r, alive, state)| {
                let mut o = r.to_json(dir);
                o["status"] = json!(if *alive { "alive" } else { "stale" });
                o["state"] = state.clone();
                o
            })
            .collect();
        println!("{}", Value::Array(v));
        return Ok(());
    }
    if rows.is_empty() {
        println!(
            "no emulators in {} (`rnicctl emu start` starts one)",
            dir.display()
        );
        return Ok(());
    }
    println!(
        "{:<12} {:>8}  {:<16} {:>7}  SOCKET / SPEC",
        "NAME", "PID", "STATUS", "DRIVERS"
    );
    for (r, alive, state) in &rows {
        let status = if *alive { "alive" } else { "stale (removed)" };
        let drivers = state["connections"]
            .as_u64()
            .map_or_else(|| "-".to_owned(), |n| n.to_string());
        println!(
            "{:<12} {:>8}  {:<16} {:>7}  {}",
            r.name,
            r.pid,
            status,
            drivers,
            r.spec()
        );
    }
    Ok(())
}

fn stop(dir: &Path, names: &[String], all: bool, timeout: Duration) -> Result<(), EmuError> {
    let known = records(dir)?;
    let targets: Vec<Record> = if all {
        known
    } else {
        if names.is_empty() {
            return Err(EmuError::NothingToStop);
        }
        let mut t = Vec::new();
        for n in names {
            match known.iter().find(|r| &r.name == n) {
                Some(r) => t.push(r.clone()),
                None => {
                    return Err(EmuError::NoSuch {
                        name: n.clone(),
                        dir: dir.display().to_string(),
                    });
                }
            }
        }
        t
    };
    if all && targets.is_empty() {
        println!("no emulators in {}", dir.display());
    }
    for r in &targets {
        stop_one(dir, r, timeout)?;
    }
    Ok(())
}

fn stop_one(dir: &Path, r: &Record, timeout: Duration) -> Result<(), EmuError> {
    if !is_our_emulator(r.pid, &r.socket) {
        remove_files(dir, r);
        println!(
            "{} (pid {}) was not running: removed its files",
            r.name, r.pid
        );
        return Ok(());
    }
    let pid = Pid::from_raw(r.pid);
    let signal = |s: Signal| match kill(pid, s) {
        Ok(()) | Err(Errno::ESRCH) => Ok(()),
        Err(source) => Err(EmuError::Signal {
            signal: s,
            pid: r.pid,
            source,
        }),
    };
    signal(Signal::SIGTERM)?;
    let deadline = Instant::now() + timeout;
    let gone = loop {
        if !socket_exists(&r.socket) && !is_our_emulator(r.pid, &r.socket) {
            break true;
        }
        if Instant::now() > deadline {
            break false;
        }
        thread::sleep(Duration::from_millis(10));
    };
    if gone {
        println!("{} (pid {}) stopped", r.name, r.pid);
    } else {
        signal(Signal::SIGKILL)?;
        let deadline = Instant::now() + Duration::from_secs(2);
        while is_our_emulator(r.pid, &r.socket) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(10));
        }
        println!(
            "{} (pid {}) did not stop within {} s of SIGTERM: killed with SIGKILL, socket {} removed",
            r.name,
            r.pid,
            timeout.as_secs(),
            r.socket.display()
        );
    }
    remove_files(dir, r);
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn names_are_plain_file_names() {
        for ok in ["emu0", "a.b", "x-y_z"] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in ["", ".hidden", "a/b", "..", "a b", &"x".repeat(65)] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn records_round_trip_through_json() {
        let r = Record {
            name: "emu3".into(),
            pid: 42,
            socket: "/tmp/e.sock".into(),
            control: Some("/run/rnic/emu/emu3.ctl".into()),
            binary: "/usr/bin/rnic-mlx5-emu".into(),
            args: vec!["--once".into()],
        };
        let v = r.to_json(Path::new("/run/rnic/emu"));
        assert_eq!(v["spec"], "mlx5:vfio-user:/tmp/e.sock");
        assert_eq!(v["state_file"], "/run/rnic/emu/emu3.state.json");
        assert_eq!(v["control"], "/run/rnic/emu/emu3.ctl");
        let back = Record::from_json(&v).unwrap();
        assert_eq!(back.control, r.control);
        assert_eq!((back.name, back.pid, back.args), (r.name, r.pid, r.args));
        // A record of an older rnicctl (no control socket) still reads.
        let mut old = v.clone();
        old.as_object_mut().unwrap().remove("control");
        assert_eq!(Record::from_json(&old).unwrap().control, None);
    }

    #[test]
    fn a_pid_that_is_not_an_emulator_is_not_alive() {
        // This test process is alive but not rnic-mlx5-emu.
        let me = i32::try_from(std::process::id()).unwrap();
        assert!(!is_our_emulator(me, Path::new("/tmp/x.sock")));
        assert!(!is_our_emulator(0, Path::new("/tmp/x.sock")));
    }
}
