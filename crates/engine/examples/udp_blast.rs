//! Loopback throughput of one batched UDP channel pair.
//!
//! ```text
//! cargo run --release -p hurtle-engine --example udp_blast -- [--mib N] [--seg BYTES] [--no-gso] [--v6]
//! ```
//!
//! One thread sends `N` MiB (default 1024) of `BYTES`-byte datagrams (default 1400) as fast as
//! [`UdpChannel::send_batch`] goes, 64 datagrams per call; another receives with
//! [`UdpChannel::recv_batch`]. Nothing paces the sender, so on a busy machine the receiver falls
//! behind and the kernel drops datagrams: both rates are printed, with the drops.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use hurtle_engine::net::udp::{ChannelOptions, RecvBatch, UdpChannel, GRO_BUF_SIZE};

fn main() {
    let mut mib: usize = 1024;
    let mut seg: usize = 1400;
    let mut gso = true;
    let mut ip: IpAddr = Ipv4Addr::LOCALHOST.into();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--mib" => mib = args.next().and_then(|v| v.parse().ok()).expect("--mib N"),
            "--seg" => {
                seg = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--seg BYTES")
            }
            "--no-gso" => gso = false,
            "--v6" => ip = Ipv6Addr::LOCALHOST.into(),
            other => panic!("unknown argument {other}; see the example's doc comment"),
        }
    }

    let opts = ChannelOptions {
        recv_buffer: 64 << 20,
        send_buffer: 64 << 20,
        read_timeout: Some(Duration::from_millis(300)),
        gso,
    };
    let mut tx = UdpChannel::bind(SocketAddr::new(ip, 0), &opts).expect("bind sender");
    let mut rx = UdpChannel::bind(SocketAddr::new(ip, 0), &opts).expect("bind receiver");
    if let Some(w) = rx.buffer_warning() {
        eprintln!("note: {w}");
    }
    println!(
        "{} -> {}: {mib} MiB in {seg}-byte datagrams, GSO segments {}, GRO segments {}, buffers {} / {} bytes",
        tx.local_addr(),
        rx.local_addr(),
        tx.max_gso_segments(),
        rx.gro_segments(),
        rx.granted_recv_buffer(),
        tx.granted_send_buffer(),
    );

    let dest = rx.local_addr();
    let done = Arc::new(AtomicBool::new(false));
    let receiver = {
        let done = done.clone();
        thread::spawn(move || {
            let mut batch = RecvBatch::new(32, GRO_BUF_SIZE);
            let (mut bytes, mut datagrams, mut calls) = (0u64, 0u64, 0u64);
            let mut first = None;
            let mut last = Instant::now();
            loop {
                let n = rx.recv_batch(&mut batch).expect("recv_batch");
                if n == 0 {
                    if done.load(Ordering::Acquire) {
                        break;
                    }
                    continue;
                }
                last = Instant::now();
                first.get_or_insert(last);
                calls += 1;
                for (_, d) in &batch {
                    bytes += d.len() as u64;
                    datagrams += 1;
                }
            }
            let secs = first.map_or(0.0, |f| (last - f).as_secs_f64());
            (bytes, datagrams, calls, secs, rx.kernel_drops())
        })
    };

    let per_call = 64;
    let mut buf = vec![0xA5u8; per_call * seg];
    let total = (mib << 20) / seg;
    let start = Instant::now();
    let mut seq = 0u64;
    while (seq as usize) < total {
        let n = per_call.min(total - seq as usize);
        for d in buf.chunks_mut(seg).take(n) {
            d[..8].copy_from_slice(&seq.to_le_bytes());
            seq += 1;
        }
        tx.send_batch(dest, &buf[..n * seg], seg)
            .expect("send_batch");
    }
    let send_secs = start.elapsed().as_secs_f64();
    done.store(true, Ordering::Release);
    let (bytes, datagrams, calls, recv_secs, drops) = receiver.join().expect("receiver thread");

    let sent_bytes = (total * seg) as f64;
    println!(
        "sent     {:>9.0} Mbit/s  {:>10.0} datagrams/s  ({total} datagrams in {send_secs:.3} s)",
        sent_bytes * 8.0 / send_secs / 1e6,
        total as f64 / send_secs,
    );
    println!(
        "received {:>9.0} Mbit/s  {:>10.0} datagrams/s  ({datagrams} datagrams, {:.1} per recv call, {:.2}% lost, kernel drops {drops:?})",
        bytes as f64 * 8.0 / recv_secs / 1e6,
        datagrams as f64 / recv_secs,
        datagrams as f64 / calls.max(1) as f64,
        100.0 * (1.0 - datagrams as f64 / total as f64),
    );
}
