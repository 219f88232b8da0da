//! Joining released packets into GSO super-packets, so a lump of packets
//! released together costs the kernel one write (and one trip through its
//! forwarding path) instead of one per packet.
//!
//! linkem decides every packet's fate on its own (loss, queue, delay): this
//! module only sees packets that are already released, in release order.
//! Consecutive packets of one IPv4 UDP or TCP flow join a **run** when the
//! kernel can cut the run back into exactly those packets: the same headers
//! (addresses, ports, TTL, TOS; for TCP every header byte but the sequence
//! number and checksum), payloads of one size but the last, which may be
//! shorter, and for TCP contiguous sequence numbers and no flags beyond ACK
//! (PSH on the last). A run is written as one packet behind a
//! `virtio_net_hdr` that asks for segmentation (`GSO_UDP_L4` or `GSO_TCPV4`)
//! with a partial checksum, as a VM's virtio NIC hands the host a TSO packet;
//! the kernel segments it where it must (or a receiver with GRO takes it
//! whole, as it would from a real NIC's coalesced interrupt). Anything else
//! (IPv6, IP options, fragments, SYN/FIN/RST, pure ACKs) is written alone.
//! One field may come out changed: the kernel numbers a run's IPv4 IDs up from
//! the first packet's, where the sender's may have differed (Linux gives an
//! unconnected socket's DF datagrams ID 0); IDs matter only to fragments.
//!
//! Pure functions on byte slices, no I/O: [`Run::can_join`] and
//! [`Run::header`], tested below by segmenting what they build the way the
//! kernel does and comparing with the packets that went in.

/// Size of `struct virtio_net_hdr`, the prefix of every read and write on a
/// TUN device opened with `IFF_VNET_HDR`.
pub const VNET_HDR_LEN: usize = 10;

const F_NEEDS_CSUM: u8 = 1;
const GSO_NONE: u8 = 0;
const GSO_TCPV4: u8 = 1;
const GSO_UDP_L4: u8 = 5;

/// Most packets one run carries (the kernel's `UDP_MAX_SEGMENTS` is 128).
pub const MAX_RUN: usize = 64;
/// Most bytes one run carries: an IPv4 total length.
const MAX_RUN_BYTES: usize = 65_535;

const IP_HDR: usize = 20;
const UDP: u8 = 17;
const TCP: u8 = 6;
const TCP_ACK: u8 = 0x10;
const TCP_PSH: u8 = 0x08;

/// The `virtio_net_hdr` for a packet written alone: no offload asked for.
pub const PLAIN_HDR: [u8; VNET_HDR_LEN] = [0; VNET_HDR_LEN];

/// A packet that could be part of a run: IPv4 without options, not a
/// fragment, UDP or TCP with a payload.
#[derive(Clone, Copy, Debug)]
struct Seg<'a> {
    pkt: &'a [u8],
    proto: u8,
    /// IP plus transport header length.
    hdr: usize,
}

impl<'a> Seg<'a> {
    fn parse(pkt: &'a [u8]) -> Option<Seg<'a>> {
        if pkt.len() < IP_HDR + 8 || pkt[0] != 0x45 {
            return None;
        }
        if usize::from(u16::from_be_bytes([pkt[2], pkt[3]])) != pkt.len() {
            return None;
        }
        // More-fragments flag or a fragment offset: a fragment.
        if u16::from_be_bytes([pkt[6], pkt[7]]) & 0x3fff != 0 {
            return None;
        }
        let proto = pkt[9];
        let hdr = match proto {
            UDP => {
                let udp_len = usize::from(u16::from_be_bytes([pkt[24], pkt[25]]));
                if udp_len != pkt.len() - IP_HDR {
                    return None;
                }
                IP_HDR + 8
            }
            TCP => {
                if pkt.len() < IP_HDR + 20 {
                    return None;
                }
                let doff = usize::from(pkt[IP_HDR + 12] >> 4) * 4;
                let flags = pkt[IP_HDR + 13];
                if doff < 20 || flags & !(TCP_ACK | TCP_PSH) != 0 || flags & TCP_ACK == 0 {
                    return None;
                }
                IP_HDR + doff
            }
            _ => return None,
        };
        (pkt.len() > hdr).then_some(Seg { pkt, proto, hdr })
    }

    fn payload(&self) -> usize {
        self.pkt.len() - self.hdr
    }

    fn tcp_seq(&self) -> u32 {
        let t = &self.pkt[IP_HDR..];
        u32::from_be_bytes([t[4], t[5], t[6], t[7]])
    }

    fn tcp_flags(&self) -> u8 {
        self.pkt[IP_HDR + 13]
    }
}

/// Consecutive packets of one flow that can go out as one GSO write.
#[derive(Clone, Copy, Debug)]
pub struct Run<'a> {
    /// The run's first and last packet; `None` if its one packet cannot start a run.
    ends: Option<(Seg<'a>, Seg<'a>)>,
    count: usize,
    bytes: usize,
}

impl<'a> Run<'a> {
    /// A run of the one packet `pkt`.
    pub fn start(pkt: &'a [u8]) -> Run<'a> {
        let seg = Seg::parse(pkt);
        Run {
            ends: seg.map(|s| (s, s)),
            count: 1,
            bytes: pkt.len(),
        }
    }

    /// Packets in the run.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Adds `pkt` to the run if the kernel can segment the run back into
    /// the same packets; `false` (and the run unchanged) if not.
    pub fn can_join(&mut self, pkt: &'a [u8]) -> bool {
        let (Some((first, last)), Some(next)) = (self.ends, Seg::parse(pkt)) else {
            return false;
        };
        let size = first.payload();
        let fits = self.count < MAX_RUN
            && self.bytes + next.payload() <= MAX_RUN_BYTES
            && next.proto == first.proto
            && next.hdr == first.hdr
            // Only the last segment may be short.
            && last.payload() == size
            && next.payload() <= size
            // TOS; DF; TTL and protocol; addresses.
            && next.pkt[1] == first.pkt[1]
            && next.pkt[6] == first.pkt[6]
            && next.pkt[8..10] == first.pkt[8..10]
            && next.pkt[12..IP_HDR] == first.pkt[12..IP_HDR];
        let flow = fits
            && match first.proto {
                UDP => next.pkt[IP_HDR..IP_HDR + 4] == first.pkt[IP_HDR..IP_HDR + 4],
                _ => {
                    let (a, b) = (&first.pkt[IP_HDR..first.hdr], &next.pkt[IP_HDR..next.hdr]);
                    // Ports, ack, offset, window, urgent pointer, options: all
                    // but the sequence number, the flags (PSH may end a run)
                    // and the checksum.
                    a[..4] == b[..4]
                        && a[8..13] == b[8..13]
                        && a[14..16] == b[14..16]
                        && a[18..] == b[18..]
                        && last.tcp_flags() == TCP_ACK
                        && next.tcp_seq() == last.tcp_seq().wrapping_add(size as u32)
                }
            };
        if flow {
            self.ends = Some((first, next));
            self.count += 1;
            self.bytes += next.payload();
        }
        flow
    }

    /// The `virtio_net_hdr` and the IP and transport header to write in
    /// front of the run's payloads: for one packet, [`PLAIN_HDR`] and
    /// nothing (the packet is written whole). `out` is cleared first.
    /// Returns the header length of each packet of the run, that is, where
    /// each one's payload starts.
    pub fn header(&self, out: &mut Vec<u8>) -> usize {
        out.clear();
        let (Some((first, last)), true) = (self.ends, self.count > 1) else {
            out.extend_from_slice(&PLAIN_HDR);
            return 0;
        };
        let total = self.bytes;
        let (gso_type, csum_offset) = match first.proto {
            UDP => (GSO_UDP_L4, 6u16),
            _ => (GSO_TCPV4, 16u16),
        };
        out.push(F_NEEDS_CSUM);
        out.push(gso_type);
        out.extend_from_slice(&(first.hdr as u16).to_ne_bytes());
        out.extend_from_slice(&(first.payload() as u16).to_ne_bytes());
        out.extend_from_slice(&(IP_HDR as u16).to_ne_bytes());
        out.extend_from_slice(&csum_offset.to_ne_bytes());
        let h = VNET_HDR_LEN;
        out.extend_from_slice(&first.pkt[..first.hdr]);
        out[h + 2..h + 4].copy_from_slice(&(total as u16).to_be_bytes());
        out[h + 10..h + 12].copy_from_slice(&[0, 0]);
        let ip_csum = !fold(sum16(&out[h..h + IP_HDR]));
        out[h + 10..h + 12].copy_from_slice(&ip_csum.to_be_bytes());
        let l4_len = (total - IP_HDR) as u16;
        let t = h + IP_HDR;
        if first.proto == UDP {
            out[t + 4..t + 6].copy_from_slice(&l4_len.to_be_bytes());
        } else {
            out[t + 13] |= last.tcp_flags() & TCP_PSH;
        }
        // A partial checksum: the pseudo-header's sum, for the kernel (or
        // whoever segments the run) to finish over each segment.
        let pseudo = sum16(&first.pkt[12..IP_HDR]) + u32::from(first.proto) + u32::from(l4_len);
        out[t + usize::from(csum_offset)..t + usize::from(csum_offset) + 2]
            .copy_from_slice(&fold(pseudo).to_be_bytes());
        first.hdr
    }
}

/// Whether a `virtio_net_hdr` read from a TUN device describes a plain
/// packet: linkem asks for no offloads, so the kernel segments and sums
/// everything before handing it over.
pub fn plain(hdr: &[u8]) -> bool {
    hdr.len() == VNET_HDR_LEN && hdr[1] == GSO_NONE
}

fn sum16(b: &[u8]) -> u32 {
    b.chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum()
}

fn fold(mut s: u32) -> u16 {
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ipv4(proto: u8, l4: &[u8], id: u16) -> Vec<u8> {
        let total = IP_HDR + l4.len();
        let mut p = vec![0x45, 0];
        p.extend_from_slice(&(total as u16).to_be_bytes());
        p.extend_from_slice(&id.to_be_bytes());
        p.extend_from_slice(&[0x40, 0, 64, proto, 0, 0]); // DF, TTL 64
        p.extend_from_slice(&[10, 201, 1, 2, 10, 201, 2, 2]);
        let c = !fold(sum16(&p));
        p[10..12].copy_from_slice(&c.to_be_bytes());
        p.extend_from_slice(l4);
        p
    }

    fn udp(sport: u16, payload: &[u8], id: u16) -> Vec<u8> {
        let mut u = sport.to_be_bytes().to_vec();
        u.extend_from_slice(&4000u16.to_be_bytes());
        u.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        u.extend_from_slice(&[0xab, 0xcd]); // whatever the sender summed
        u.extend_from_slice(payload);
        ipv4(UDP, &u, id)
    }

    fn tcp(seq: u32, flags: u8, payload: &[u8], id: u16) -> Vec<u8> {
        let mut t = 5001u16.to_be_bytes().to_vec();
        t.extend_from_slice(&40000u16.to_be_bytes());
        t.extend_from_slice(&seq.to_be_bytes());
        t.extend_from_slice(&7u32.to_be_bytes()); // ack
        t.extend_from_slice(&[0x80, flags, 0x01, 0xf5, 0x12, 0x34, 0, 0]); // doff 8
        t.extend_from_slice(&[1, 1, 8, 10, 0, 0, 0, 9, 0, 0, 0, 3]); // NOP NOP TS
        t.extend_from_slice(payload);
        ipv4(TCP, &t, id)
    }

    fn payload(n: usize, tag: u8) -> Vec<u8> {
        (0..n).map(|i| tag.wrapping_add(i as u8)).collect()
    }

    /// Runs over `pkts` as the forwarder makes them: (run lengths, each
    /// run's write: header plus payloads).
    fn runs(pkts: &[Vec<u8>]) -> (Vec<usize>, Vec<Vec<u8>>) {
        let (mut lens, mut writes) = (Vec::new(), Vec::new());
        let mut i = 0;
        while i < pkts.len() {
            let mut run = Run::start(&pkts[i]);
            let mut j = i + 1;
            while j < pkts.len() && run.can_join(&pkts[j]) {
                j += 1;
            }
            let mut w = Vec::new();
            let skip = run.header(&mut w);
            for p in &pkts[i..j] {
                w.extend_from_slice(&p[skip..]);
            }
            lens.push(run.len());
            writes.push(w);
            i = j;
        }
        (lens, writes)
    }

    /// Cuts a write the way the kernel's GSO does (IDs counting up, UDP
    /// length and TCP sequence per segment, PSH on the last TCP segment
    /// only), with the checksums finished: the packets that come out.
    fn segment(w: &[u8]) -> Vec<Vec<u8>> {
        let (vh, p) = w.split_at(VNET_HDR_LEN);
        if vh[1] == GSO_NONE {
            return vec![p.to_vec()];
        }
        assert_eq!(vh[0], F_NEEDS_CSUM);
        let hdr = usize::from(u16::from_ne_bytes([vh[2], vh[3]]));
        let size = usize::from(u16::from_ne_bytes([vh[4], vh[5]]));
        let csum_at = IP_HDR + usize::from(u16::from_ne_bytes([vh[8], vh[9]]));
        assert_eq!(u16::from_ne_bytes([vh[6], vh[7]]) as usize, IP_HDR);
        assert_eq!(
            usize::from(u16::from_be_bytes([p[2], p[3]])),
            p.len(),
            "total length"
        );
        assert_eq!(fold(sum16(&p[..IP_HDR])), 0xffff, "IP header checksum");
        // The partial checksum is the pseudo-header's sum over the whole run.
        let l4_len = (p.len() - IP_HDR) as u32;
        let pseudo = fold(sum16(&p[12..IP_HDR]) + u32::from(p[9]) + l4_len);
        assert_eq!(u16::from_be_bytes([p[csum_at], p[csum_at + 1]]), pseudo);
        let id0 = u16::from_be_bytes([p[4], p[5]]);
        let chunks: Vec<&[u8]> = p[hdr..].chunks(size).collect();
        let n = chunks.len();
        chunks
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut s = p[..hdr].to_vec();
                s.extend_from_slice(c);
                let total = s.len() as u16;
                s[2..4].copy_from_slice(&total.to_be_bytes());
                s[4..6].copy_from_slice(&id0.wrapping_add(i as u16).to_be_bytes());
                if p[9] == UDP {
                    s[24..26].copy_from_slice(&(total - IP_HDR as u16).to_be_bytes());
                } else {
                    let seq = u32::from_be_bytes([s[24], s[25], s[26], s[27]]);
                    let seq = seq.wrapping_add((i * size) as u32);
                    s[24..28].copy_from_slice(&seq.to_be_bytes());
                    if i + 1 < n {
                        s[IP_HDR + 13] &= !TCP_PSH;
                    }
                }
                s
            })
            .collect()
    }

    /// What must survive a trip through a run: everything but the IP and
    /// transport checksums.
    fn sans_checksums(p: &[u8]) -> Vec<u8> {
        let mut p = p.to_vec();
        p[10..12].copy_from_slice(&[0, 0]);
        let at = if p[9] == UDP { 26 } else { 36 };
        p[at..at + 2].copy_from_slice(&[0, 0]);
        p
    }

    fn round_trip(pkts: &[Vec<u8>]) -> Vec<usize> {
        let (lens, writes) = runs(pkts);
        let out: Vec<Vec<u8>> = writes.iter().flat_map(|w| segment(w)).collect();
        assert_eq!(out.len(), pkts.len());
        for (a, b) in pkts.iter().zip(&out) {
            assert_eq!(sans_checksums(a), sans_checksums(b));
        }
        lens
    }

    #[test]
    fn a_udp_flow_joins_and_segments_back_into_the_same_datagrams() {
        let pkts: Vec<Vec<u8>> = (0..5)
            .map(|i| {
                udp(
                    9000,
                    &payload(if i == 4 { 300 } else { 1400 }, i),
                    100 + i as u16,
                )
            })
            .collect();
        assert_eq!(round_trip(&pkts), vec![5]);
    }

    #[test]
    fn a_tcp_flow_joins_only_while_its_sequence_is_contiguous() {
        let mss = 1448;
        let mut pkts: Vec<Vec<u8>> = (0..4)
            .map(|i| {
                tcp(
                    1000 + i * mss as u32,
                    TCP_ACK,
                    &payload(mss, i as u8),
                    7 + i as u16,
                )
            })
            .collect();
        // A gap (a lost segment), then a short segment with PSH ends the flow.
        pkts.push(tcp(1000 + 5 * mss as u32, TCP_ACK, &payload(mss, 5), 12));
        pkts.push(tcp(
            1000 + 6 * mss as u32,
            TCP_ACK | TCP_PSH,
            &payload(99, 6),
            13,
        ));
        assert_eq!(round_trip(&pkts), vec![4, 2]);
    }

    #[test]
    fn what_the_kernel_could_not_cut_back_is_written_alone() {
        let a = udp(9000, &payload(1400, 0), 1);
        let short = udp(9000, &payload(1000, 1), 2);
        let other_port = udp(9001, &payload(1400, 2), 3);
        let pure_ack = tcp(5, TCP_ACK, &[], 4);
        let syn = tcp(5, 0x02, &payload(10, 0), 5);
        let mut ipv6 = vec![0x60; 60];
        ipv6[4..6].copy_from_slice(&20u16.to_be_bytes());
        let mut fragment = a.clone();
        fragment[6] |= 0x20; // more fragments
                             // A short datagram may end a run, but nothing follows it.
        assert_eq!(
            round_trip(&[a.clone(), short.clone(), a.clone()]),
            vec![2, 1]
        );
        assert_eq!(round_trip(&[a.clone(), other_port.clone()]), vec![1, 1]);
        assert_eq!(round_trip(&[pure_ack.clone(), pure_ack]), vec![1, 1]);
        assert_eq!(round_trip(&[syn.clone(), syn]), vec![1, 1]);
        assert_eq!(round_trip(&[fragment.clone(), fragment]), vec![1, 1]);
        // A PSH segment ends a TCP run.
        let psh = tcp(0, TCP_ACK | TCP_PSH, &payload(100, 0), 1);
        let after = tcp(100, TCP_ACK, &payload(100, 0), 2);
        assert_eq!(round_trip(&[psh, after]), vec![1, 1]);
        let (lens, _) = runs(&[ipv6.clone(), ipv6]);
        assert_eq!(lens, vec![1, 1]);
    }

    #[test]
    fn a_run_stops_at_its_segment_and_byte_limits() {
        let pkts: Vec<Vec<u8>> = (0..MAX_RUN + 3)
            .map(|i| udp(9000, &payload(100, i as u8), i as u16))
            .collect();
        assert_eq!(round_trip(&pkts), vec![MAX_RUN, 3]);
        let big: Vec<Vec<u8>> = (0..50)
            .map(|i| udp(9000, &payload(1400, i as u8), i as u16))
            .collect();
        let lens = round_trip(&big);
        assert!(lens.iter().all(|&n| IP_HDR + 8 + n * 1400 <= MAX_RUN_BYTES));
        assert_eq!(lens.iter().sum::<usize>(), 50);
    }

    #[test]
    fn hostile_bytes_never_panic() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let good = udp(9000, &payload(200, 0), 1);
        for _ in 0..20_000 {
            let mut p = good.clone();
            let len = (next() % 260) as usize;
            p.resize(len, 0);
            for _ in 0..(next() % 4) {
                if !p.is_empty() {
                    let i = (next() as usize) % p.len();
                    p[i] = next() as u8;
                }
            }
            let mut run = Run::start(&good);
            let joined = run.can_join(&p);
            let mut w = Vec::new();
            let _ = run.header(&mut w);
            assert!(!joined || run.len() == 2);
            let _ = plain(&p);
        }
    }
}
