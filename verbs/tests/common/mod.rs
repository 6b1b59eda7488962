//! What the integration tests share: the built library as `libibverbs.so.1`
//! in a directory of its own, stock tools run against it, server/client
//! pairs, and rnic's own binaries to talk to.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// `target/<profile>` of this test binary.
pub fn profile_dir() -> PathBuf {
    // target/<profile>/deps/<test binary>
    let exe = std::env::current_exe().expect("test binary path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_path_buf()
}

/// A directory holding the drop-in as `libibverbs.so.1` (what
/// `verbs/install.sh` makes), for `LD_LIBRARY_PATH`.
pub fn lib_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        // `cargo test` compiles the library but leaves target/<profile>/
        // librnic_verbs.so as the last `cargo build` made it: a stale copy
        // would test old code without a word.
        cargo_build(&["-p", "rnic-verbs", "--lib"]);
        let built = profile_dir().join("librnic_verbs.so");
        assert!(
            built.exists(),
            "{} is missing: cargo builds it with the rnic-verbs package (cargo test -p rnic-verbs)",
            built.display()
        );
        // One directory per test binary, replaced atomically (a running
        // program may have the previous copy mapped).
        let name = std::env::current_exe()
            .ok()
            .and_then(|e| e.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "test".to_owned());
        let dir = profile_dir().join("verbs-test").join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let tmp = dir.join(format!(".libibverbs.so.1.{}", std::process::id()));
        std::fs::copy(&built, &tmp).unwrap();
        std::fs::rename(&tmp, dir.join("libibverbs.so.1")).unwrap();
        dir
    })
}

/// Panic with the package to install when `tool` is not on `PATH`.
pub fn require(tool: &str, package: &str) {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).exists()))
        .unwrap_or(false);
    assert!(
        found,
        "{tool} not found: install Debian's {package} (scripts/test.sh installs it)"
    );
}

/// `program` with the drop-in first on the library path.
pub fn verbs_cmd(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new(program);
    c.env("LD_LIBRARY_PATH", lib_dir());
    c.stdin(Stdio::null());
    c
}

/// Wait for `child` to exit within `limit`; kill it past that.
pub fn wait_output(mut child: Child, limit: Duration, what: &str) -> Output {
    let start = Instant::now();
    loop {
        match child.try_wait().unwrap() {
            Some(_) => return child.wait_with_output().unwrap(),
            None if start.elapsed() > limit => {
                let _ = child.kill();
                let out = child.wait_with_output().unwrap();
                panic!(
                    "{what} did not finish in {limit:?}\nstdout:\n{}\nstderr:\n{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Both sides' output.
#[derive(Debug)]
pub struct Pair {
    /// The server's.
    pub server: Output,
    /// The client's.
    pub client: Output,
}

impl Pair {
    /// stdout of the server, then the client.
    pub fn stdout(&self) -> (String, String) {
        (
            String::from_utf8_lossy(&self.server.stdout).into_owned(),
            String::from_utf8_lossy(&self.client.stdout).into_owned(),
        )
    }

    /// Everything both printed, for assertion messages.
    pub fn all(&self) -> String {
        format!(
            "server (status {}):\n{}{}\nclient (status {}):\n{}{}",
            self.server.status,
            String::from_utf8_lossy(&self.server.stdout),
            String::from_utf8_lossy(&self.server.stderr),
            self.client.status,
            String::from_utf8_lossy(&self.client.stdout),
            String::from_utf8_lossy(&self.client.stderr)
        )
    }

    /// Both exited with status 0.
    pub fn ok(&self) -> bool {
        self.server.status.success() && self.client.status.success()
    }
}

/// Start `server`, wait until TCP `port` listens, run `client`; both
/// within `limit`.
pub fn run_pair(mut server: Command, mut client: Command, port: u16, limit: Duration) -> Pair {
    let srv = server
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the server");
    let start = Instant::now();
    let mut srv = Some(srv);
    while !srv
        .as_ref()
        .is_some_and(|s| rnic_testkit::tcp_listening(s.id(), port))
    {
        if let Some(s) = srv.as_mut()
            && let Ok(Some(_)) = s.try_wait()
        {
            let out = srv.take().unwrap().wait_with_output().unwrap();
            panic!(
                "the server exited before listening on {port}:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        assert!(
            start.elapsed() < limit,
            "nothing listens on TCP {port} after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let cli = client
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the client");
    let left = limit.saturating_sub(start.elapsed());
    let client = wait_output(cli, left, "the client");
    let server = wait_output(srv.take().unwrap(), Duration::from_secs(20), "the server");
    Pair { server, client }
}

/// A TCP port for one test: `base` plus this process's offset, so test
/// binaries running at once do not collide.
pub fn port(base: u16) -> u16 {
    base + (std::process::id() % 500) as u16 * 8
}

/// Read all of a reader (for piped children).
pub fn read_all(mut r: impl Read) -> String {
    let mut s = String::new();
    let _ = r.read_to_string(&mut s);
    s
}

/// `cargo build --locked ARGS` in this test binary's profile (a no-op
/// taking a second or two when everything is fresh).
fn cargo_build(args: &[&str]) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut c = Command::new(cargo);
    c.args(["build", "--locked"]).args(args);
    if profile_dir().ends_with("release") {
        c.arg("--release");
    }
    let st = c.status().expect("run cargo build");
    assert!(st.success(), "cargo build {args:?} failed");
}

/// One of rnic's own binaries (`rnicctl`, `examples/rc_pingpong`) of this
/// profile, built (or brought up to date) once per test binary.
pub fn rnic_bin(rel: &str, build: &[&str]) -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        cargo_build(&[
            "-p",
            "rnicctl",
            "-p",
            "rnic-mlx5-emu",
            "-p",
            "rnic",
            // Without --bins, --example would limit the build to it.
            "--bins",
            "--example",
            "rc_pingpong",
        ]);
    });
    let path = profile_dir().join(rel);
    assert!(path.exists(), "{} not built ({build:?})", path.display());
    path
}

/// An emulated ConnectX function (rnic-mlx5-emu) serving `sock` until dropped.
pub struct Emulator(std::process::Child, PathBuf);

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = std::fs::remove_file(&self.1);
    }
}

impl Emulator {
    /// Start one on a socket named after `name` and this process; its spec
    /// with GID 0 = `ip`, named `rnic_mlx5` (both ends of a pair use that
    /// name, each in its own process).
    pub fn start(name: &str, ip: &str) -> (Emulator, String) {
        let bin = rnic_bin("rnic-mlx5-emu", &["rnic-mlx5-emu"]);
        let sock =
            std::env::temp_dir().join(format!("rnic-verbs-{name}-{}.sock", std::process::id()));
        let child = Command::new(bin)
            .arg("--socket")
            .arg(&sock)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let emu = Emulator(child, sock.clone());
        let start = std::time::Instant::now();
        while !sock.exists() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the emulator did not listen"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        (
            emu,
            format!("rnic_mlx5=mlx5:vfio-user:{}@{ip}", sock.display()),
        )
    }
}
