//! The floor under the load generator's CPU: what the kernel charges for the messages alone.
//!
//! `voxgate-client load xiaozhi` sends one small WebSocket frame per session every 60 ms and
//! reads the server's replies. On loopback a `send` also runs the receiving side's TCP work
//! (and the wake-up of the receiving thread) inside the sender's system call, so part of the
//! generator's system time is not its own doing. This program measures that floor with no
//! protocol code at all: one thread, `sessions` nonblocking TCP sockets to a sink process,
//! prebuilt payloads written with one `write` each on a 10 ms grid (each socket every
//! `--up-ms`), replies the sink sends (each socket every `--down-ms`) read with one `read` per
//! ready socket from a level-triggered epoll. It prints its own CPU (user / system, from
//! `getrusage`) per message and per 1,000 sessions at the rates given.
//!
//! ```sh
//! cargo run --release -p voxgate-client --example tcp_floor -- --sessions 500 --seconds 20
//! ```
//!
//! `--up-ms 0` or `--down-ms 0` turns a direction off, to price a send and a receive apart;
//! `--reads tick` reads only on the grid (one wake-up per tick however many replies came)
//! instead of as soon as a reply arrives.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::resource::{UsageWho, getrusage};

const TICK: Duration = Duration::from_millis(10);

#[derive(Debug, Clone)]
struct Opts {
    sessions: usize,
    seconds: u64,
    up_ms: u64,
    down_ms: u64,
    up_bytes: usize,
    down_bytes: usize,
    tick_reads: bool,
    sink: bool,
}

fn parse() -> anyhow::Result<Opts> {
    let mut o = Opts {
        sessions: 500,
        seconds: 20,
        up_ms: 60,
        down_ms: 120,
        up_bytes: 130,
        down_bytes: 180,
        tick_reads: false,
        sink: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--sessions" => o.sessions = value()?.parse()?,
            "--seconds" => o.seconds = value()?.parse()?,
            "--up-ms" => o.up_ms = value()?.parse()?,
            "--down-ms" => o.down_ms = value()?.parse()?,
            "--up-bytes" => o.up_bytes = value()?.parse()?,
            "--down-bytes" => o.down_bytes = value()?.parse()?,
            "--reads" => o.tick_reads = value()? == "tick",
            "--sink" => o.sink = true,
            other => bail!("unknown option {other}"),
        }
    }
    for ms in [o.up_ms, o.down_ms] {
        if ms % 10 != 0 {
            bail!("periods must be multiples of 10 ms");
        }
    }
    Ok(o)
}

fn main() -> anyhow::Result<()> {
    let o = parse()?;
    if o.sink { sink(&o) } else { sender(&o) }
}

/// Every socket whose slot is due at `tick` (socket `i` every `period` ticks, phase `i`).
fn due(tick: u64, i: usize, period: u64) -> bool {
    period > 0 && (tick + i as u64).is_multiple_of(period)
}

/// The sink: accepts, reads and drops everything, and sends `down_bytes` to each connection
/// every `down_ms`. Its CPU is not measured.
fn sink(o: &Opts) -> anyhow::Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    println!("{}", listener.local_addr()?);
    std::io::stdout().flush()?;
    let mut conns = Vec::with_capacity(o.sessions);
    while conns.len() < o.sessions {
        let (s, _) = listener.accept()?;
        s.set_nodelay(true)?;
        s.set_nonblocking(true)?;
        conns.push(s);
    }
    let epoll = Epoll::new(EpollCreateFlags::empty())?;
    for (i, c) in conns.iter().enumerate() {
        epoll.add(c.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, i as u64))?;
    }
    let payload = vec![0x82u8; o.down_bytes];
    let mut buf = vec![0u8; 65536];
    let mut events = vec![EpollEvent::empty(); 1024];
    let start = Instant::now();
    let mut tick = 0u64;
    let period = o.down_ms / 10;
    loop {
        let next = start + TICK * u32::try_from(tick).unwrap_or(u32::MAX);
        let wait = next.saturating_duration_since(Instant::now());
        let ms = u16::try_from(wait.as_micros().div_ceil(1000)).unwrap_or(u16::MAX);
        let n = epoll.wait(&mut events, EpollTimeout::from(ms))?;
        for ev in &events[..n] {
            let Some(c) = usize::try_from(ev.data())
                .ok()
                .and_then(|i| conns.get_mut(i))
            else {
                continue;
            };
            match c.read(&mut buf) {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => return Ok(()),
            }
        }
        if Instant::now() >= next {
            for (i, c) in conns.iter_mut().enumerate() {
                if due(tick, i, period) {
                    let _ = c.write(&payload);
                }
            }
            tick += 1;
        }
    }
}

/// The whole machine's busy and stolen ticks and all ticks, from `/proc/stat`.
fn machine() -> (u64, u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let get = |i: usize| v.get(i).copied().unwrap_or(0);
    let total: u64 = v.iter().take(8).sum();
    (total - get(3) - get(4), get(7), total)
}

fn cpu() -> anyhow::Result<(f64, f64)> {
    let u = getrusage(UsageWho::RUSAGE_SELF)?;
    let secs = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    Ok((secs(u.user_time()), secs(u.system_time())))
}

fn sender(o: &Opts) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .args(["--sink", "--sessions", &o.sessions.to_string()])
        .args(["--down-ms", &o.down_ms.to_string()])
        .args(["--down-bytes", &o.down_bytes.to_string()])
        .stdout(Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().context("sink stdout")?).read_line(&mut line)?;
    let addr = line.trim().to_owned();
    let mut socks = Vec::with_capacity(o.sessions);
    for _ in 0..o.sessions {
        let s = TcpStream::connect(&addr)?;
        s.set_nodelay(true)?;
        s.set_nonblocking(true)?;
        socks.push(s);
    }
    let epoll = Epoll::new(EpollCreateFlags::empty())?;
    for (i, s) in socks.iter().enumerate() {
        epoll.add(s.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, i as u64))?;
    }
    let payload = vec![0x82u8; o.up_bytes];
    let mut buf = vec![0u8; 16384];
    let mut events = vec![EpollEvent::empty(); 1024];
    let period = o.up_ms / 10;
    let warm = Duration::from_secs(2);
    let start = Instant::now();
    let end = start + warm + Duration::from_secs(o.seconds);
    let (mut sent, mut reads, mut bytes_in, mut wakeups) = (0u64, 0u64, 0u64, 0u64);
    let mut before = None;
    let mut tick = 0u64;
    let mut read_ready = |n: usize,
                          events: &[EpollEvent],
                          socks: &mut [TcpStream],
                          reads: &mut u64,
                          bytes_in: &mut u64| {
        for ev in &events[..n] {
            let Some(s) = usize::try_from(ev.data())
                .ok()
                .and_then(|i| socks.get_mut(i))
            else {
                continue;
            };
            if let Ok(k) = s.read(&mut buf) {
                *reads += 1;
                *bytes_in += k as u64;
            }
        }
    };
    loop {
        let next = start + TICK * u32::try_from(tick).unwrap_or(u32::MAX);
        let now = Instant::now();
        if before.is_none() && now >= start + warm {
            before = Some((cpu()?, now, sent, reads, bytes_in, wakeups, machine()));
        }
        if now >= end {
            break;
        }
        if o.tick_reads {
            std::thread::sleep(next.saturating_duration_since(now));
            let n = epoll.wait(&mut events, EpollTimeout::ZERO)?;
            wakeups += 1;
            read_ready(n, &events, &mut socks, &mut reads, &mut bytes_in);
        } else {
            let ms = u16::try_from(
                next.saturating_duration_since(now)
                    .as_micros()
                    .div_ceil(1000),
            )
            .unwrap_or(u16::MAX);
            let n = epoll.wait(&mut events, EpollTimeout::from(ms))?;
            wakeups += 1;
            read_ready(n, &events, &mut socks, &mut reads, &mut bytes_in);
        }
        if Instant::now() >= next {
            for (i, s) in socks.iter_mut().enumerate() {
                if due(tick, i, period) && s.write(&payload).is_ok() {
                    sent += 1;
                }
            }
            tick += 1;
        }
    }
    let after = cpu()?;
    let m1 = machine();
    let Some(((u0, s0), t0, sent0, reads0, bytes0, wake0, m0)) = before else {
        bail!("no measurement window");
    };
    let wall = t0.elapsed().as_secs_f64();
    let (user, system) = (after.0 - u0, after.1 - s0);
    let (sent, reads, bytes_in, wakeups) = (
        sent - sent0,
        reads - reads0,
        bytes_in - bytes0,
        wakeups - wake0,
    );
    let msgs_in = bytes_in / o.down_bytes.max(1) as u64;
    let ticks = (m1.2 - m0.2).max(1) as f64;
    let (busy, steal) = (
        100.0 * (m1.0 - m0.0) as f64 / ticks,
        100.0 * (m1.1 - m0.1) as f64 / ticks,
    );
    let messages = (sent + msgs_in).max(1) as f64;
    let per_1000 = (user + system) / wall * 100.0 * 1000.0 / o.sessions as f64;
    println!(
        "{{\"sessions\":{},\"reads\":\"{}\",\"up_ms\":{},\"down_ms\":{},\"wall_s\":{wall:.1},\"sent\":{sent},\"messages_in\":{msgs_in},\"reads_done\":{reads},\"wakeups\":{wakeups},\"user_s\":{user:.3},\"system_s\":{system:.3},\"us_per_message\":{:.2},\"user_us_per_message\":{:.2},\"system_us_per_message\":{:.2},\"percent_of_one_core\":{:.2},\"percent_per_1000_sessions\":{per_1000:.2},\"machine_busy_percent\":{busy:.0},\"steal_percent\":{steal:.1}}}",
        o.sessions,
        if o.tick_reads { "tick" } else { "immediate" },
        o.up_ms,
        o.down_ms,
        (user + system) * 1e6 / messages,
        user * 1e6 / messages,
        system * 1e6 / messages,
        (user + system) / wall * 100.0,
    );
    drop(socks);
    let _ = child.wait();
    Ok(())
}
