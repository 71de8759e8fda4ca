//! WebRTC media: one UDP socket for every peer connection, each connection a str0m [`Rtc`]
//! driven by its own task.
//!
//! str0m is sans-IO like our own machines (`handle_input` / `poll_output`), so this module is
//! the I/O around it and nothing else:
//!
//! - the [`Endpoint`] owns the UDP socket and routes each datagram to its connection: a STUN
//!   binding request by the ICE username (`<our ufrag>:<their ufrag>`, the ufrag made from OS
//!   randomness per connection), everything else (DTLS, SRTP, SCTP) by the source address the
//!   connection's STUN came from;
//! - a connection's task ([`peer`]) feeds its `Rtc` datagrams and timeouts, sends what it
//!   transmits, decodes the client's Opus into the door's input rate, encodes reply audio into
//!   20 ms Opus frames and sends them at real time (the track is the client's jitter buffer's
//!   input, so bursts would be late audio), and carries the data channel.
//!
//! A door sees a connection as a [`PeerHandle`]: events (connected, audio, data channel text,
//! playback drained, closed) and commands (remote ICE candidates, data channel text, reply
//! audio, clear, close). The door driver holds the handle and turns a translator's
//! [`MediaCommand`]s into calls on it, so translators stay free of I/O.

pub(crate) mod peer;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use str0m::change::SdpOffer;
use str0m::rtp::Extension;
use str0m::{Candidate, IceCreds, Rtc, RtcConfig};
use tokio::net::UdpSocket;
use tokio::sync::mpsc;

use crate::config::WebRtcConfig;
use crate::metrics::Metrics;

pub(crate) use peer::{MediaEvent, PeerCommand, PeerHandle};

/// Largest UDP datagram read (WebRTC keeps packets under the path MTU).
const MAX_DATAGRAM: usize = 2048;
/// Kernel buffer asked for on the shared socket, each way: every session's packets queue in
/// one buffer, and the default (about 200 KiB, a few hundred packets) overflows in a moment of
/// scheduling delay at a few hundred sessions. The kernel caps it at `net.core.rmem_max`.
const SOCKET_BUFFER: usize = 4 << 20;
/// Datagrams waiting for one connection's task; more are dropped (UDP may lose them anyway).
const PEER_QUEUE: usize = 256;
/// Largest SDP offer accepted.
pub(crate) const MAX_OFFER_BYTES: usize = 64 * 1024;

/// Why an offer was not answered.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OfferError {
    /// The offer is not SDP, or has no usable audio.
    #[error("bad offer: {0}")]
    BadOffer(String),
    /// `[webrtc] max_sessions` connections are open.
    #[error("too many WebRTC sessions")]
    Full,
    /// WebRTC is switched off (`[webrtc] enabled = false`).
    #[error("WebRTC is not enabled on this server")]
    Disabled,
}

/// What a door asks of its connection for one session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PeerOptions {
    /// The rate the door wants the client's audio at (the engine's input rate).
    pub(crate) input_rate: u32,
    /// What the client's data channels are for.
    pub(crate) data_channel: DataChannel,
}

/// What a connection does with the data channels the client opens. Either way the answer
/// negotiates them (str0m accepts an offer's `m=application` line), so a client that opens
/// one sees it open and must find something behind it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DataChannel {
    /// The door talks over the first channel the client opens (VIP): its text reaches the
    /// door as [`MediaEvent::Data`], [`PeerCommand::Data`] writes to it, and its closing ends
    /// the connection. Other channels are ignored.
    Door,
    /// The door only uses the audio track (Gemini). Every channel the client opens is served
    /// as the original Gemini bridge gateway served its WebRTC test client's: a text message
    /// `ping` is answered with a text `pong` on the same channel; anything else is ignored,
    /// and a channel closing ends nothing.
    PingPong,
}

/// An answered offer.
pub(crate) struct Accepted {
    /// The SDP answer, with the server's candidates in it.
    pub(crate) answer: String,
    /// The server's candidates as `candidate:...` lines, for signalling that trickles them.
    pub(crate) candidates: Vec<String>,
    /// The connection.
    pub(crate) peer: PeerHandle,
}

impl std::fmt::Debug for Accepted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Accepted")
            .field("candidates", &self.candidates)
            .finish_non_exhaustive()
    }
}

/// A datagram for one connection.
#[derive(Debug)]
pub(crate) struct Datagram {
    pub(crate) at: Instant,
    pub(crate) source: SocketAddr,
    pub(crate) data: Vec<u8>,
}

/// Where datagrams go: by our ICE ufrag, and by the address a ufrag's STUN came from.
#[derive(Default)]
struct Routes {
    by_ufrag: HashMap<String, mpsc::Sender<Datagram>>,
    by_addr: HashMap<SocketAddr, String>,
}

/// The shared UDP socket and the connections behind it.
pub(crate) struct Endpoint {
    /// The DTLS certificate every connection presents (`None`: str0m makes one each).
    cert: Option<str0m::config::DtlsCert>,
    socket: Arc<UdpSocket>,
    local: SocketAddr,
    candidates: Vec<Candidate>,
    routes: Mutex<Routes>,
    open: AtomicUsize,
    config: WebRtcConfig,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("local", &self.local)
            .field("open", &self.open.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    /// Binds the UDP socket and starts routing its datagrams. The routing task ends when the
    /// endpoint is dropped.
    pub(crate) async fn bind(
        config: &WebRtcConfig,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<Arc<Self>> {
        // str0m takes its crypto (DTLS, SRTP) from a process-wide default; installing it twice
        // is harmless.
        let crypto = str0m::crypto::from_feature_flags();
        crypto.clone().install_process_default();
        // One DTLS certificate for every connection: making a key pair per offer costs
        // milliseconds of CPU on the runtime, which a burst of offers turns into late audio for
        // everyone. The fingerprint is in each answer, so sharing it reveals nothing.
        let cert = crypto.dtls_provider.generate_certificate();
        let socket = Arc::new(bind_udp(config.udp_listen)?);
        let local = socket.local_addr()?;
        let mut candidates = Vec::new();
        let ips = if config.candidate_ips.is_empty() {
            vec![local.ip()]
        } else {
            config.candidate_ips.clone()
        };
        for ip in ips {
            let addr = SocketAddr::new(ip, local.port());
            let c = Candidate::host(addr, "udp").map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("[webrtc] candidate {addr}: {e}"),
                )
            })?;
            candidates.push(c);
        }
        if let Some(public) = config.public_ip {
            let addr = SocketAddr::new(public, local.port());
            let c = Candidate::server_reflexive(addr, local, "udp").map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("[webrtc] public_ip {public}: {e}"),
                )
            })?;
            candidates.push(c);
        }
        let endpoint = Arc::new(Self {
            cert,
            socket,
            local,
            candidates,
            routes: Mutex::new(Routes::default()),
            open: AtomicUsize::new(0),
            config: config.clone(),
            metrics,
        });
        tokio::spawn(route(
            Arc::downgrade(&endpoint),
            Arc::clone(&endpoint.socket),
        ));
        Ok(endpoint)
    }

    /// The bound UDP address.
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Connections open now.
    pub(crate) fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// Answers an SDP offer and starts its connection.
    ///
    /// # Errors
    /// [`OfferError`] for an offer that is not SDP or has no Opus audio, a full server or
    /// WebRTC switched off.
    pub(crate) fn accept(
        self: &Arc<Self>,
        offer: &str,
        options: PeerOptions,
    ) -> Result<Accepted, OfferError> {
        if !self.config.enabled {
            return Err(OfferError::Disabled);
        }
        if offer.len() > MAX_OFFER_BYTES {
            return Err(OfferError::BadOffer(format!(
                "the offer is over {MAX_OFFER_BYTES} bytes"
            )));
        }
        if !offer.lines().any(|l| l.starts_with("m=audio")) {
            return Err(OfferError::BadOffer("the offer has no audio m-line".into()));
        }
        if !offer
            .lines()
            .any(|l| l.starts_with("a=rtpmap:") && l.to_ascii_lowercase().contains("opus/48000"))
        {
            return Err(OfferError::BadOffer(
                "the offer's audio has no Opus (opus/48000)".into(),
            ));
        }
        // The parser's message can quote its internal state (a pointer offset): logged, not
        // sent to the client.
        let offer = SdpOffer::from_sdp_string(offer).map_err(|e| {
            tracing::debug!(error = %e, "webrtc: offer is not SDP");
            OfferError::BadOffer("the offer is not valid SDP".into())
        })?;
        // Reserve the slot before the work, so concurrent offers cannot overshoot the limit.
        let slot = Slot::take(self).ok_or(OfferError::Full)?;
        let ufrag = random_token(8);
        let creds = IceCreds {
            ufrag: ufrag.clone(),
            pass: random_token(24),
        };
        let now = Instant::now();
        // Only the header extensions voice needs: the MID (BUNDLE demultiplexing) and the
        // audio level. Transport-wide congestion control is left out on purpose: the server
        // runs no bandwidth estimation and voice is a fixed ~32 kbit/s, so its feedback (ten
        // RTCP packets a second each way per session, and bookkeeping for every packet) would
        // be work for nothing; without it browsers keep their configured Opus bitrate.
        // ICE-lite: the server only answers the client's connectivity checks and never sends
        // its own, so an offer naming other addresses (or a trickle of them) cannot make it
        // send STUN to them (a reflection or scan tool once `udp_listen` is public). A server
        // with a reachable address is what ICE-lite is for (RFC 8445 §2.5).
        let mut config = RtcConfig::new()
            .set_ice_lite(true)
            .set_local_ice_credentials(creds)
            .clear_codecs()
            .enable_opus(true, false)
            .clear_extension_map()
            .set_extension(1, Extension::AudioLevel)
            .set_extension(4, Extension::RtpMid);
        if let Some(cert) = &self.cert {
            config = config.set_dtls_cert(cert.clone());
        }
        let mut rtc: Rtc = config.build(now);
        for c in &self.candidates {
            rtc.add_local_candidate(c.clone());
        }
        let answer = rtc.sdp_api().accept_offer(offer).map_err(|e| {
            tracing::debug!(error = %e, "webrtc: offer cannot be answered");
            OfferError::BadOffer("the offer cannot be answered (no usable audio or data)".into())
        })?;
        let (tx, rx) = mpsc::channel(PEER_QUEUE);
        self.routes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .by_ufrag
            .insert(ufrag.clone(), tx);
        let candidates = self
            .candidates
            .iter()
            .map(|c| c.to_sdp_string().trim_start_matches("a=").to_owned())
            .collect();
        let peer = peer::start(
            rtc,
            peer::PeerContext {
                endpoint: Arc::clone(self),
                ufrag,
                datagrams: rx,
                options,
                connect_timeout: Duration::from_secs(self.config.connect_timeout_secs),
                max_playout: Duration::from_millis(self.config.max_playout_ms),
                _slot: slot,
            },
        );
        Ok(Accepted {
            answer: limit_opus_rates(
                &answer.to_sdp_string(),
                options.input_rate,
                peer::ENCODE_RATE,
            ),
            candidates,
            peer,
        })
    }

    fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Sends one datagram; a full socket buffer loses it like the network would.
    fn send(&self, to: SocketAddr, data: &[u8]) {
        if let Err(e) = self.socket.try_send_to(data, to)
            && e.kind() != std::io::ErrorKind::WouldBlock
        {
            tracing::debug!(%to, error = %e, "webrtc: send failed");
        }
    }

    /// Forgets a closed connection's routes.
    fn remove(&self, ufrag: &str) {
        let mut routes = self
            .routes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        routes.by_ufrag.remove(ufrag);
        routes.by_addr.retain(|_, u| u != ufrag);
    }

    /// The connection a datagram belongs to.
    fn route_of(&self, source: SocketAddr, data: &[u8]) -> Option<mpsc::Sender<Datagram>> {
        let mut routes = self
            .routes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(ufrag) = stun_local_ufrag(data) {
            let tx = routes.by_ufrag.get(&ufrag)?.clone();
            if routes.by_addr.len() < 4 * routes.by_ufrag.len() + 64
                || routes.by_addr.contains_key(&source)
            {
                routes.by_addr.insert(source, ufrag);
            }
            return Some(tx);
        }
        let ufrag = routes.by_addr.get(&source)?;
        routes.by_ufrag.get(ufrag).cloned()
    }
}

/// The shared UDP socket, with large kernel buffers ([`SOCKET_BUFFER`]).
fn bind_udp(addr: SocketAddr) -> std::io::Result<UdpSocket> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    // Best effort: a smaller buffer than asked for still works, only drops sooner.
    let _ = socket.set_recv_buffer_size(SOCKET_BUFFER);
    let _ = socket.set_send_buffer_size(SOCKET_BUFFER);
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    UdpSocket::from_std(socket.into())
}

/// Adds RFC 7587's rate hints to the answer's Opus format line: `maxplaybackrate` (the rate
/// the door decodes to: nothing above its Nyquist frequency reaches the engine, so a sender
/// that honours it, as browsers do, encodes wideband SILK instead of hybrid fullband, which is
/// cheaper for it to encode, for us to decode, and smaller on the wire) and
/// `sprop-maxcapturerate` (the rate our replies are encoded at). Parameters the line already
/// has are kept, a missing line is added; an answer without Opus is returned as it was.
fn limit_opus_rates(sdp: &str, playback: u32, capture: u32) -> String {
    let eol = if sdp.contains("\r\n") { "\r\n" } else { "\n" };
    let opus_pts: Vec<&str> = sdp
        .lines()
        .filter_map(|l| l.strip_prefix("a=rtpmap:"))
        .filter_map(|rest| rest.split_once(' '))
        .filter(|(_, codec)| codec.to_ascii_lowercase().starts_with("opus/48000"))
        .map(|(pt, _)| pt)
        .collect();
    let has_fmtp = |pt: &str| {
        sdp.lines()
            .filter_map(|l| l.strip_prefix("a=fmtp:"))
            .any(|rest| rest.split(' ').next() == Some(pt))
    };
    let mut out = String::with_capacity(sdp.len() + 64);
    for line in sdp.lines() {
        out.push_str(line);
        if let Some(rest) = line.strip_prefix("a=rtpmap:")
            && let Some(pt) = rest.split(' ').next()
            && opus_pts.contains(&pt)
            && !has_fmtp(pt)
        {
            out.push_str(&format!(
                "{eol}a=fmtp:{pt} maxplaybackrate={playback};sprop-maxcapturerate={capture}"
            ));
        }
        if let Some(rest) = line.strip_prefix("a=fmtp:")
            && let Some((pt, params)) = rest.split_once(' ')
            && opus_pts.contains(&pt)
        {
            let has = |name: &str| {
                params
                    .split(';')
                    .any(|p| p.trim().split('=').next() == Some(name))
            };
            if !has("maxplaybackrate") {
                out.push_str(&format!(";maxplaybackrate={playback}"));
            }
            if !has("sprop-maxcapturerate") {
                out.push_str(&format!(";sprop-maxcapturerate={capture}"));
            }
        }
        out.push_str(eol);
    }
    out
}

/// A reserved connection slot, given back when the connection's task ends.
pub(crate) struct Slot(Arc<Endpoint>);

impl Slot {
    fn take(endpoint: &Arc<Endpoint>) -> Option<Self> {
        let max = endpoint.config.max_sessions;
        endpoint
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()?;
        Some(Self(Arc::clone(endpoint)))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The local ufrag of a STUN binding request (`USERNAME` is `<receiver>:<sender>`).
fn stun_local_ufrag(data: &[u8]) -> Option<String> {
    // A STUN message starts with two zero bits and carries the magic cookie; DTLS, RTP and
    // RTCP never do (RFC 7983's demultiplexing rule).
    if data.len() < 20 || data[0] > 3 || data[4..8] != [0x21, 0x12, 0xA4, 0x42] {
        return None;
    }
    let msg = str0m::ice::StunMessage::parse(data).ok()?;
    let username = msg.username()?;
    let (local, _) = username.split_once(':')?;
    Some(local.to_owned())
}

/// Reads the socket and hands each datagram to its connection until the endpoint is gone.
async fn route(endpoint: std::sync::Weak<Endpoint>, socket: Arc<UdpSocket>) {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let (n, source) = match socket.recv_from(&mut buf).await {
            Ok(v) => v,
            // ICMP errors from earlier sends surface here on some systems; keep reading.
            Err(e) => {
                tracing::trace!(error = %e, "webrtc: receive error");
                continue;
            }
        };
        let Some(endpoint) = endpoint.upgrade() else {
            return;
        };
        let data = &buf[..n];
        let Some(tx) = endpoint.route_of(source, data) else {
            continue;
        };
        let datagram = Datagram {
            at: Instant::now(),
            source,
            data: data.to_vec(),
        };
        if tx.try_send(datagram).is_err() {
            endpoint.metrics().webrtc_dropped_datagram();
        }
    }
}

/// Letters and digits from the OS's randomness, uniformly (bytes past the largest multiple of
/// the alphabet's size are drawn again): ICE credentials (ufrag 4+, password 22+ characters of
/// the ice-char set) and session ids.
pub(crate) fn random_token(len: usize) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    // 248: the largest multiple of 62 that fits a byte.
    const LIMIT: u8 = 248;
    const _: () = assert!(LIMIT as usize == 256 / ALPHABET.len() * ALPHABET.len());
    let mut out = String::with_capacity(len);
    while out.len() < len {
        let Ok(bytes) = crate::secret::random_bytes(len * 2) else {
            // The OS has no randomness to give: str0m's own credentials are the fallback,
            // rather than refusing every call.
            let pass = IceCreds::new().pass;
            out.extend(pass.chars().filter(char::is_ascii_alphanumeric));
            continue;
        };
        out.extend(
            bytes
                .iter()
                .filter(|b| **b < LIMIT)
                .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char),
        );
    }
    out.truncate(len);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_ice_chars_of_the_length_asked() {
        let t = random_token(24);
        assert_eq!(t.len(), 24);
        assert!(t.bytes().all(|b| b.is_ascii_alphanumeric()));
        assert_ne!(random_token(24), t);
    }

    #[test]
    fn opus_answers_carry_rate_hints() {
        let sdp = "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=rtpmap:111 opus/48000/2\r\n\
                   a=fmtp:111 minptime=10;useinbandfec=1\r\na=rtpmap:0 PCMU/8000\r\n\
                   a=fmtp:0 foo=1\r\n";
        let out = limit_opus_rates(sdp, 16_000, 16_000);
        assert!(out.contains(
            "a=fmtp:111 minptime=10;useinbandfec=1;maxplaybackrate=16000;sprop-maxcapturerate=16000\r\n"
        ));
        assert!(out.contains("a=fmtp:0 foo=1\r\n"), "other codecs untouched");
        assert_eq!(
            out.len(),
            sdp.len() + ";maxplaybackrate=16000;sprop-maxcapturerate=16000".len()
        );
        // Present parameters are kept, not doubled; SDP without Opus is unchanged.
        let set = "a=rtpmap:96 OPUS/48000/2\na=fmtp:96 maxplaybackrate=8000\n";
        assert_eq!(
            limit_opus_rates(set, 16_000, 16_000),
            "a=rtpmap:96 OPUS/48000/2\na=fmtp:96 maxplaybackrate=8000;sprop-maxcapturerate=16000\n"
        );
        let bare = "a=rtpmap:111 opus/48000/2\n";
        assert_eq!(
            limit_opus_rates(bare, 16_000, 24_000),
            "a=rtpmap:111 opus/48000/2\na=fmtp:111 maxplaybackrate=16000;sprop-maxcapturerate=24000\n"
        );
        let none = "v=0\r\nm=audio 9 RTP/AVP 0\r\na=fmtp:0 x=1\r\n";
        assert_eq!(limit_opus_rates(none, 16_000, 16_000), none);
    }

    #[test]
    fn non_stun_traffic_has_no_ufrag() {
        assert_eq!(stun_local_ufrag(&[]), None);
        // A DTLS record (content type 22).
        let mut dtls = vec![22u8, 0xfe, 0xfd];
        dtls.resize(40, 0);
        assert_eq!(stun_local_ufrag(&dtls), None);
        // An RTP packet (version 2).
        let mut rtp = vec![0x80u8, 111];
        rtp.resize(40, 0);
        assert_eq!(stun_local_ufrag(&rtp), None);
    }
}
