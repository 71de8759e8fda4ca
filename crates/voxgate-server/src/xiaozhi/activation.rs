//! Device activation with `[xiaozhi] auth` on: who is issued a token at OTA time.
//!
//! A pure state machine (no I/O, no clock: time comes in as `now`, randomness as a function):
//!
//! 1. OTA from a device that is neither on `allowed_devices` nor activated creates a *pending
//!    activation* for its (device id, client id): a 6-digit code, unique among the pending
//!    ones, and a random challenge. The device shows and speaks the code and polls
//!    `/activate`; asking again (the firmware repeats OTA) returns the same code until it
//!    expires.
//! 2. An operator who reads the code off the device confirms it ([`Activations::confirm`]):
//!    the pair is *activated*. The code is the proof that the operator looked at the device
//!    that asked; the listing of pending activations therefore never shows codes.
//! 3. The device's next poll gets 200, its next OTA a token bound to its client and device ids.
//!
//! Bounds: at most `max_pending` pending activations, each expiring after `timeout`; at most
//! [`MAX_ACTIVATED`] activated devices (confirming one more is refused rather than silently
//! forgetting another). Client and device ids are capped at [`MAX_ID_BYTES`].
//!
//! Who may push whom out: a pending code remembers the address that asked for it
//! ([`source_key`]: the IPv4 address, or the IPv6 /64 prefix). One address holds at most
//! `max_pending_per_source` codes; its next one replaces its own oldest. When the whole table
//! is full, a new code replaces the oldest code of the address holding the most, so a flood
//! from one address (or a few) only ever evicts its own codes, and a real device's code (one
//! per device) goes last. Emptying the table of real devices takes as many flooding addresses
//! as the table has places, and the OTA rate limit ([`super::rate`]) slows each of them.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use voxgate_xiaozhi::ota::DeviceAllowlist;

use crate::secret::secret_eq;

/// Most activated devices remembered.
pub(crate) const MAX_ACTIVATED: usize = 4096;

/// Longest device id, client id or serial number accepted, in bytes.
pub(crate) const MAX_ID_BYTES: usize = 128;

/// Codes are 6 decimal digits.
const CODE_SPACE: u32 = 1_000_000;

/// The largest multiple of [`CODE_SPACE`] that fits a `u32`: draws at or above it are
/// rejected so every code is equally likely.
const CODE_DRAW_LIMIT: u32 = (u32::MAX / CODE_SPACE) * CODE_SPACE;

/// Draws before giving up on a fresh code (rejections and collisions with pending codes are
/// both rare with at most a few hundred pending among a million codes).
const CODE_DRAWS: usize = 32;

/// Random bytes in a challenge.
const CHALLENGE_BYTES: usize = 16;

/// A device an operator activated; also the persisted form (one JSON object per device).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ActivatedDevice {
    /// The device id (MAC), lowercase.
    pub(crate) device_id: String,
    /// The client id (UUID) the device asked with; a token is issued only for this pair.
    pub(crate) client_id: String,
    /// When it was activated, Unix seconds.
    #[serde(default)]
    pub(crate) activated_at: u64,
}

/// The address a pending code is counted against: an IPv4 address (IPv4-mapped IPv6 too) as
/// it is, an IPv6 address by its /64 prefix (one subscriber's network, whose 2^64 addresses
/// would otherwise each count as another source).
pub(crate) fn source_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let prefix = u128::from(v6) & !((1_u128 << 64) - 1);
            IpAddr::V6(prefix.into())
        }
        v4 => v4,
    }
}

/// Who asks at OTA time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Identity<'a> {
    /// The client's address (the socket peer, or the client behind a trusted proxy).
    pub(crate) source: IpAddr,
    /// `Device-Id`, lowercase.
    pub(crate) device_id: &'a str,
    /// `Client-Id`.
    pub(crate) client_id: &'a str,
    /// `Activation-Version: 2`: the device has a serial number and echoes the challenge.
    pub(crate) signs_challenge: bool,
    /// `Serial-Number`, for the operator's listing.
    pub(crate) serial_number: Option<&'a str>,
}

/// What OTA tells a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OtaDecision {
    /// On `allowed_devices`: issue a token.
    Allowed,
    /// Activated earlier with this client id: issue a token.
    Activated,
    /// Not yet: show this code and poll.
    Pending(Challenge),
    /// No fresh code could be drawn (the random source failed).
    Unavailable,
}

/// A pending activation as the device is told about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Challenge {
    /// The 6-digit code.
    pub(crate) code: String,
    /// The challenge the device echoes when it polls.
    pub(crate) challenge: String,
    /// Time left before the code expires.
    pub(crate) remaining: Duration,
}

/// The answer to a device's `/activate` poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Poll {
    /// Activated (200).
    Done,
    /// Pending, not yet confirmed (202).
    Waiting,
    /// Pending, but the echoed challenge is missing or wrong.
    ChallengeMismatch,
    /// Nothing pending for this device: it should ask OTA again.
    Unknown,
}

/// Why a code was not confirmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConfirmError {
    /// No pending activation has this code (wrong, expired or evicted).
    NotFound,
    /// [`MAX_ACTIVATED`] devices are activated already.
    Full,
}

/// A pending activation in the operator's listing (no code: see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct PendingInfo {
    pub(crate) device_id: String,
    pub(crate) client_id: String,
    /// The address (or IPv6 /64) it is counted against.
    pub(crate) address: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) serial_number: Option<String>,
    pub(crate) age_secs: u64,
    pub(crate) expires_in_secs: u64,
}

#[derive(Debug, Clone)]
struct Pending {
    device_id: String,
    client_id: String,
    challenge: String,
    signs_challenge: bool,
    serial_number: Option<String>,
    created: Instant,
    /// [`source_key`] of the address that asked.
    source: IpAddr,
}

/// Pending and activated devices.
#[derive(Debug)]
pub(crate) struct Activations {
    allowlist: DeviceAllowlist,
    timeout: Duration,
    max_pending: usize,
    /// Pending codes one source address may hold.
    max_pending_per_source: usize,
    /// By code: codes are unique among pending activations.
    pending: HashMap<String, Pending>,
    /// By device id: one client id per device.
    activated: HashMap<String, ActivatedDevice>,
}

impl Activations {
    /// Empty state: codes live for `timeout`, at most `max_pending` (at least one) at a time
    /// and `max_pending_per_source` from one address (0: no limit but `max_pending`).
    pub(crate) fn new(
        allowlist: DeviceAllowlist,
        timeout: Duration,
        max_pending: usize,
        max_pending_per_source: usize,
    ) -> Self {
        Self {
            allowlist,
            timeout,
            max_pending: max_pending.max(1),
            max_pending_per_source: match max_pending_per_source {
                0 => usize::MAX,
                n => n,
            },
            pending: HashMap::new(),
            activated: HashMap::new(),
        }
    }

    /// Adds devices activated earlier (a persisted list); returns how many were taken. Entries
    /// with unusable ids and those beyond [`MAX_ACTIVATED`] are skipped.
    pub(crate) fn restore(&mut self, devices: impl IntoIterator<Item = ActivatedDevice>) -> usize {
        let mut taken = 0;
        for mut d in devices {
            d.device_id = d.device_id.trim().to_ascii_lowercase();
            if !valid_id(&d.device_id) || !valid_id(&d.client_id) {
                continue;
            }
            if self.activated.len() >= MAX_ACTIVATED && !self.activated.contains_key(&d.device_id) {
                break;
            }
            self.activated.insert(d.device_id.clone(), d);
            taken += 1;
        }
        taken
    }

    /// Decides an OTA request. `random(n)` returns `n` random bytes (`None`: no randomness).
    pub(crate) fn ota(
        &mut self,
        now: Instant,
        who: Identity<'_>,
        random: &mut impl FnMut(usize) -> Option<Vec<u8>>,
    ) -> OtaDecision {
        self.expire(now);
        if self.allowlist.contains(who.device_id) {
            return OtaDecision::Allowed;
        }
        if self.is_activated(who.device_id, who.client_id) {
            return OtaDecision::Activated;
        }
        if let Some((code, p)) = self.find_pending(who.device_id, who.client_id) {
            return OtaDecision::Pending(Challenge {
                code: code.clone(),
                challenge: p.challenge.clone(),
                remaining: self.remaining(p, now),
            });
        }
        let Some(code) = self.fresh_code(random) else {
            return OtaDecision::Unavailable;
        };
        let Some(bytes) = random(CHALLENGE_BYTES) else {
            return OtaDecision::Unavailable;
        };
        let challenge: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let source = source_key(who.source);
        while self.held_by(source) >= self.max_pending_per_source {
            self.evict_oldest_of(source);
        }
        while self.pending.len() >= self.max_pending {
            match self.largest_holder() {
                Some(holder) => self.evict_oldest_of(holder),
                None => break,
            }
        }
        let pending = Pending {
            device_id: who.device_id.to_owned(),
            client_id: who.client_id.to_owned(),
            challenge: challenge.clone(),
            signs_challenge: who.signs_challenge,
            serial_number: who
                .serial_number
                .filter(|s| s.len() <= MAX_ID_BYTES)
                .map(str::to_owned),
            created: now,
            source,
        };
        self.pending.insert(code.clone(), pending);
        OtaDecision::Pending(Challenge {
            code,
            challenge,
            remaining: self.timeout,
        })
    }

    /// Answers a device's `/activate` poll. A device that signs the challenge (activation
    /// version 2) must echo it; one that does not may, and then it must match. The HMAC over
    /// the challenge is not verified: that needs the key in the device's eFuses.
    pub(crate) fn poll(
        &mut self,
        now: Instant,
        device_id: &str,
        client_id: &str,
        challenge: Option<&str>,
    ) -> Poll {
        self.expire(now);
        if self.allowlist.contains(device_id) || self.is_activated(device_id, client_id) {
            return Poll::Done;
        }
        let Some((_, p)) = self.find_pending(device_id, client_id) else {
            return Poll::Unknown;
        };
        match challenge {
            Some(c) if secret_eq(&p.challenge, c) => Poll::Waiting,
            None if !p.signs_challenge => Poll::Waiting,
            _ => Poll::ChallengeMismatch,
        }
    }

    /// Confirms the pending activation with `code`: its device is activated.
    pub(crate) fn confirm(
        &mut self,
        now: Instant,
        code: &str,
        now_unix_secs: u64,
    ) -> Result<ActivatedDevice, ConfirmError> {
        self.expire(now);
        let code = code.trim();
        let device_id = &self
            .pending
            .get(code)
            .ok_or(ConfirmError::NotFound)?
            .device_id;
        if self.activated.len() >= MAX_ACTIVATED && !self.activated.contains_key(device_id) {
            return Err(ConfirmError::Full);
        }
        let p = self.pending.remove(code).ok_or(ConfirmError::NotFound)?;
        let device = ActivatedDevice {
            device_id: p.device_id,
            client_id: p.client_id,
            activated_at: now_unix_secs,
        };
        self.activated
            .insert(device.device_id.clone(), device.clone());
        Ok(device)
    }

    /// Pending activations, oldest first.
    pub(crate) fn pending(&mut self, now: Instant) -> Vec<PendingInfo> {
        self.expire(now);
        let mut list: Vec<_> = self.pending.values().collect();
        list.sort_by_key(|p| p.created);
        list.into_iter()
            .map(|p| PendingInfo {
                device_id: p.device_id.clone(),
                client_id: p.client_id.clone(),
                address: p.source.to_string(),
                serial_number: p.serial_number.clone(),
                age_secs: now.saturating_duration_since(p.created).as_secs(),
                expires_in_secs: self.remaining(p, now).as_secs(),
            })
            .collect()
    }

    /// Activated devices, by device id (also what is persisted).
    pub(crate) fn activated(&self) -> Vec<ActivatedDevice> {
        let mut list: Vec<_> = self.activated.values().cloned().collect();
        list.sort_by(|a, b| a.device_id.cmp(&b.device_id));
        list
    }

    /// Whether (`device_id`, `client_id`) was activated.
    fn is_activated(&self, device_id: &str, client_id: &str) -> bool {
        self.activated
            .get(device_id)
            .is_some_and(|d| secret_eq(&d.client_id, client_id))
    }

    fn find_pending(&self, device_id: &str, client_id: &str) -> Option<(&String, &Pending)> {
        self.pending
            .iter()
            .find(|(_, p)| p.device_id == device_id && p.client_id == client_id)
    }

    fn remaining(&self, p: &Pending, now: Instant) -> Duration {
        self.timeout
            .saturating_sub(now.saturating_duration_since(p.created))
    }

    fn expire(&mut self, now: Instant) {
        let timeout = self.timeout;
        self.pending
            .retain(|_, p| now.saturating_duration_since(p.created) < timeout);
    }

    /// Pending codes `source` holds.
    fn held_by(&self, source: IpAddr) -> usize {
        self.pending.values().filter(|p| p.source == source).count()
    }

    /// The source holding the most pending codes; of several, the one with the oldest code.
    fn largest_holder(&self) -> Option<IpAddr> {
        let mut held: HashMap<IpAddr, (usize, Instant)> = HashMap::new();
        for p in self.pending.values() {
            let e = held.entry(p.source).or_insert((0, p.created));
            e.0 += 1;
            e.1 = e.1.min(p.created);
        }
        held.into_iter()
            .max_by(|(_, (n, t)), (_, (m, u))| n.cmp(m).then(u.cmp(t)))
            .map(|(source, _)| source)
    }

    /// Drops the oldest pending code of `source`.
    fn evict_oldest_of(&mut self, source: IpAddr) {
        let oldest = self
            .pending
            .iter()
            .filter(|(_, p)| p.source == source)
            .min_by_key(|(_, p)| p.created)
            .map(|(code, _)| code.clone());
        if let Some(code) = oldest {
            self.pending.remove(&code);
        }
    }

    fn fresh_code(&self, random: &mut impl FnMut(usize) -> Option<Vec<u8>>) -> Option<String> {
        for _ in 0..CODE_DRAWS {
            let bytes: [u8; 4] = random(4)?.try_into().ok()?;
            let n = u32::from_be_bytes(bytes);
            if n >= CODE_DRAW_LIMIT {
                continue;
            }
            let code = format!("{:06}", n % CODE_SPACE);
            if !self.pending.contains_key(&code) {
                return Some(code);
            }
        }
        None
    }
}

/// Whether an id is usable: not empty, not over [`MAX_ID_BYTES`], no `|` (the token's field
/// separator) and no control characters.
pub(crate) fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_ID_BYTES
        && !id.contains('|')
        && !id.chars().any(char::is_control)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEV: &str = "aa:bb:cc:dd:ee:01";
    const CLIENT: &str = "3b5c1f2e-0000-4000-8000-000000000001";

    /// The address the tests' devices ask from, unless they say otherwise.
    const HOME: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 1));

    fn who<'a>(device_id: &'a str, client_id: &'a str) -> Identity<'a> {
        from(HOME, device_id, client_id)
    }

    fn from<'a>(source: IpAddr, device_id: &'a str, client_id: &'a str) -> Identity<'a> {
        Identity {
            source,
            device_id,
            client_id,
            signs_challenge: false,
            serial_number: None,
        }
    }

    /// A deterministic random source: a multiplicative sequence, its bytes repeated.
    fn counter() -> impl FnMut(usize) -> Option<Vec<u8>> {
        let mut n: u32 = 0;
        move |len| {
            n = n.wrapping_mul(2_654_435_761).wrapping_add(12_345);
            Some(n.to_be_bytes().iter().copied().cycle().take(len).collect())
        }
    }

    fn state() -> Activations {
        Activations::new(
            DeviceAllowlist::new(["11:22:33:44:55:66"]),
            Duration::from_secs(600),
            4,
            4,
        )
    }

    fn pending(d: OtaDecision) -> Challenge {
        match d {
            OtaDecision::Pending(c) => c,
            other => panic!("expected a pending activation, got {other:?}"),
        }
    }

    #[test]
    fn allowlisted_devices_get_a_token_at_once() {
        let mut s = state();
        let now = Instant::now();
        assert_eq!(
            s.ota(now, who("11:22:33:44:55:66", CLIENT), &mut counter()),
            OtaDecision::Allowed
        );
        assert!(s.pending(now).is_empty());
    }

    #[test]
    fn the_full_flow_on_a_virtual_clock() {
        let mut s = state();
        let t0 = Instant::now();
        let mut rng = counter();
        let c = pending(s.ota(t0, who(DEV, CLIENT), &mut rng));
        assert_eq!(c.code.len(), 6);
        assert!(c.code.bytes().all(|b| b.is_ascii_digit()));
        assert_eq!(c.challenge.len(), 2 * CHALLENGE_BYTES);
        assert_eq!(c.remaining, Duration::from_secs(600));

        // The firmware repeats OTA: same code and challenge, less time left.
        let t1 = t0 + Duration::from_secs(30);
        let again = pending(s.ota(t1, who(DEV, CLIENT), &mut rng));
        assert_eq!((&again.code, &again.challenge), (&c.code, &c.challenge));
        assert_eq!(again.remaining, Duration::from_secs(570));

        assert_eq!(s.poll(t1, DEV, CLIENT, None), Poll::Waiting);
        assert_eq!(s.poll(t1, DEV, CLIENT, Some(&c.challenge)), Poll::Waiting);
        assert_eq!(
            s.poll(t1, DEV, CLIENT, Some("not it")),
            Poll::ChallengeMismatch
        );
        assert_eq!(s.poll(t1, DEV, "other client", None), Poll::Unknown);

        let list = s.pending(t1);
        assert_eq!(list.len(), 1);
        assert_eq!((list[0].age_secs, list[0].expires_in_secs), (30, 570));
        let listed = serde_json::to_string(&list).unwrap();
        assert!(!listed.contains(&c.code), "the listing never shows codes");

        assert_eq!(s.confirm(t1, "000000", 5), Err(ConfirmError::NotFound));
        let bound = s
            .confirm(t1, &format!(" {} ", c.code), 1_700_000_000)
            .unwrap();
        assert_eq!(
            bound,
            ActivatedDevice {
                device_id: DEV.into(),
                client_id: CLIENT.into(),
                activated_at: 1_700_000_000
            }
        );
        // A code works once.
        assert_eq!(s.confirm(t1, &c.code, 5), Err(ConfirmError::NotFound));
        assert_eq!(s.poll(t1, DEV, CLIENT, None), Poll::Done);
        assert_eq!(
            s.ota(t1, who(DEV, CLIENT), &mut rng),
            OtaDecision::Activated
        );
        assert_eq!(s.activated(), [bound]);
        assert!(s.pending(t1).is_empty());
    }

    #[test]
    fn activation_binds_the_client_id_too() {
        let mut s = state();
        let t = Instant::now();
        let mut rng = counter();
        let c = pending(s.ota(t, who(DEV, CLIENT), &mut rng));
        s.confirm(t, &c.code, 0).unwrap();
        // Same MAC, another client id (someone who read the MAC off the air): a new code,
        // shown to whoever asked, which the operator never sees on the real device.
        let other = pending(s.ota(t, who(DEV, "intruder"), &mut rng));
        assert_ne!(other.code, c.code);
        assert_eq!(s.poll(t, DEV, "intruder", None), Poll::Waiting);
        assert_eq!(s.ota(t, who(DEV, CLIENT), &mut rng), OtaDecision::Activated);
    }

    #[test]
    fn signing_devices_must_echo_the_challenge() {
        let mut s = state();
        let t = Instant::now();
        let signer = Identity {
            signs_challenge: true,
            serial_number: Some("SN-1"),
            ..who(DEV, CLIENT)
        };
        let c = pending(s.ota(t, signer, &mut counter()));
        assert_eq!(s.poll(t, DEV, CLIENT, None), Poll::ChallengeMismatch);
        assert_eq!(s.poll(t, DEV, CLIENT, Some("")), Poll::ChallengeMismatch);
        assert_eq!(s.poll(t, DEV, CLIENT, Some(&c.challenge)), Poll::Waiting);
        assert_eq!(s.pending(t)[0].serial_number.as_deref(), Some("SN-1"));
    }

    #[test]
    fn codes_expire() {
        let mut s = state();
        let t0 = Instant::now();
        let mut rng = counter();
        let c = pending(s.ota(t0, who(DEV, CLIENT), &mut rng));
        let late = t0 + Duration::from_secs(600);
        assert_eq!(s.confirm(late, &c.code, 0), Err(ConfirmError::NotFound));
        assert_eq!(s.poll(late, DEV, CLIENT, None), Poll::Unknown);
        // Asking again after expiry starts over with a fresh challenge.
        let fresh = pending(s.ota(late, who(DEV, CLIENT), &mut rng));
        assert_ne!(fresh.challenge, c.challenge);
        assert_eq!(fresh.remaining, Duration::from_secs(600));
        // Just before expiry the code still works.
        let almost = late + Duration::from_secs(599);
        s.confirm(almost, &fresh.code, 0).unwrap();
    }

    #[test]
    fn pending_is_bounded_and_evicts_the_oldest() {
        let mut s = state();
        let t0 = Instant::now();
        let mut rng = counter();
        let devices: Vec<String> = (0..6).map(|i| format!("02:00:00:00:00:{i:02x}")).collect();
        let codes: Vec<String> = devices
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let t = t0 + Duration::from_secs(i as u64);
                pending(s.ota(t, who(d, CLIENT), &mut rng)).code
            })
            .collect();
        let t = t0 + Duration::from_secs(10);
        let left: Vec<String> = s.pending(t).into_iter().map(|p| p.device_id).collect();
        assert_eq!(left, devices[2..]);
        assert_eq!(s.confirm(t, &codes[0], 0), Err(ConfirmError::NotFound));
        assert_eq!(s.confirm(t, &codes[5], 0).unwrap().device_id, devices[5]);
    }

    /// Code draws from `values` (4-byte requests), constant bytes for challenges.
    fn queue(values: Vec<u32>) -> impl FnMut(usize) -> Option<Vec<u8>> {
        let mut values = values.into_iter();
        move |len| {
            if len == 4 {
                values.next().map(|v| v.to_be_bytes().to_vec())
            } else {
                Some(vec![1; len])
            }
        }
    }

    #[test]
    fn codes_are_unique_among_pending_and_drawn_without_bias() {
        let mut s = Activations::new(DeviceAllowlist::default(), Duration::from_secs(60), 10, 0);
        let t = Instant::now();
        let a = pending(s.ota(t, who("02:00:00:00:00:01", CLIENT), &mut queue(vec![7])));
        assert_eq!(a.code, "000007");
        // A collision with a pending code and a draw beyond the last full block of a million
        // are both drawn again.
        let mut draws = queue(vec![1_000_007, CODE_DRAW_LIMIT, u32::MAX, 2_000_008]);
        let b = pending(s.ota(t, who("02:00:00:00:00:02", CLIENT), &mut draws));
        assert_eq!(b.code, "000008");
        // No randomness: no code, no pending entry.
        assert_eq!(
            s.ota(t, who("02:00:00:00:00:03", CLIENT), &mut |_| None),
            OtaDecision::Unavailable
        );
        // Always colliding: gives up instead of looping.
        let mut stuck = queue(vec![7; 100]);
        assert_eq!(
            s.ota(t, who("02:00:00:00:00:04", CLIENT), &mut stuck),
            OtaDecision::Unavailable
        );
        assert_eq!(s.pending(t).len(), 2);
    }

    #[test]
    fn activated_devices_are_bounded_and_restored() {
        let mut s = state();
        let t = Instant::now();
        let restored = s.restore((0..MAX_ACTIVATED + 3).map(|i| ActivatedDevice {
            device_id: format!("DEV-{i}"),
            client_id: CLIENT.into(),
            activated_at: 1,
        }));
        assert_eq!(restored, MAX_ACTIVATED);
        assert_eq!(s.activated().len(), MAX_ACTIVATED);
        assert_eq!(
            s.ota(t, who("dev-0", CLIENT), &mut counter()),
            OtaDecision::Activated
        );
        // Full: a new device's code is kept pending, not confirmed over another device.
        let c = pending(s.ota(t, who(DEV, CLIENT), &mut counter()));
        assert_eq!(s.confirm(t, &c.code, 0), Err(ConfirmError::Full));
        assert_eq!(s.pending(t).len(), 1);
        // Re-activating a known device (new client id) is still possible.
        let again = pending(s.ota(t, who("dev-1", "new-client"), &mut counter()));
        assert_eq!(
            s.confirm(t, &again.code, 0).unwrap().client_id,
            "new-client"
        );
        // Unusable ids in a file are skipped.
        let mut fresh = state();
        let bad = ["", "a|b", "x\ny"].map(|id| ActivatedDevice {
            device_id: id.into(),
            client_id: CLIENT.into(),
            activated_at: 0,
        });
        assert_eq!(fresh.restore(bad), 0);
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn device(n: usize) -> String {
        format!(
            "02:00:00:{:02x}:{:02x}:{:02x}",
            n >> 16,
            (n >> 8) & 0xff,
            n & 0xff
        )
    }

    /// The finding of issue 36: 300 fake devices from one address used to push a real
    /// device's code out of the table. Now that address only replaces its own codes.
    #[test]
    fn a_flooding_address_only_evicts_its_own_codes() {
        let mut s = Activations::new(DeviceAllowlist::default(), Duration::from_secs(600), 256, 8);
        let t0 = Instant::now();
        let mut rng = counter();
        let real = pending(s.ota(t0, from(ip("198.51.100.7"), DEV, CLIENT), &mut rng));
        let neighbour = pending(s.ota(
            t0,
            from(ip("198.51.100.8"), "aa:bb:cc:dd:ee:02", CLIENT),
            &mut rng,
        ));
        let flooder = ip("203.0.113.9");
        let mut last = Vec::new();
        for i in 0..300 {
            let t = t0 + Duration::from_millis(i as u64 + 1);
            last.push(pending(s.ota(t, from(flooder, &device(i), CLIENT), &mut rng)).code);
        }
        let t = t0 + Duration::from_secs(1);
        let listed = s.pending(t);
        assert_eq!(listed.len(), 2 + 8);
        let from_flooder: Vec<&str> = listed
            .iter()
            .filter(|p| p.address == "203.0.113.9")
            .map(|p| p.device_id.as_str())
            .collect();
        // The flooder keeps its 8 newest; its first 292 were its own evictions.
        let newest: Vec<String> = (292..300).map(device).collect();
        assert_eq!(from_flooder, newest);
        assert_eq!(s.confirm(t, &last[0], 0), Err(ConfirmError::NotFound));
        assert_eq!(s.confirm(t, &real.code, 0).unwrap().device_id, DEV);
        assert_eq!(
            s.confirm(t, &neighbour.code, 0).unwrap().device_id,
            "aa:bb:cc:dd:ee:02"
        );
    }

    #[test]
    fn a_full_table_evicts_from_the_largest_holder() {
        // Room for 6, at most 4 from one address.
        let mut s = Activations::new(DeviceAllowlist::default(), Duration::from_secs(600), 6, 4);
        let t0 = Instant::now();
        let mut rng = counter();
        let real = pending(s.ota(t0, from(ip("198.51.100.7"), DEV, CLIENT), &mut rng));
        let (a, b) = (ip("203.0.113.1"), ip("203.0.113.2"));
        // Two flooding addresses take turns, 100 codes each: once the table is full, each new
        // code replaces one of the other flooder's (it holds more), never the real device's.
        for i in 0..200 {
            let source = if i % 2 == 0 { a } else { b };
            let t = t0 + Duration::from_millis(i as u64 + 1);
            pending(s.ota(t, from(source, &device(i), CLIENT), &mut rng));
        }
        let t = t0 + Duration::from_secs(1);
        let listed = s.pending(t);
        let count = |addr: &str| listed.iter().filter(|p| p.address == addr).count();
        assert_eq!(listed.len(), 6);
        assert_eq!(
            (
                count("198.51.100.7"),
                count("203.0.113.1"),
                count("203.0.113.2")
            ),
            (1, 2, 3)
        );
        assert_eq!(s.confirm(t, &real.code, 0).unwrap().device_id, DEV);
        // The limit of the scheme: when every place belongs to a different address, the
        // oldest code goes, whoever asked for it.
        let mut s = Activations::new(DeviceAllowlist::default(), Duration::from_secs(600), 3, 4);
        let real = pending(s.ota(t0, from(ip("198.51.100.7"), DEV, CLIENT), &mut rng));
        for (i, last) in [10_u8, 11, 12].into_iter().enumerate() {
            let t = t0 + Duration::from_millis(u64::from(last));
            let source = IpAddr::V4(std::net::Ipv4Addr::new(203, 0, 113, last));
            pending(s.ota(t, from(source, &device(i), CLIENT), &mut rng));
        }
        assert_eq!(s.confirm(t, &real.code, 0), Err(ConfirmError::NotFound));
    }

    #[test]
    fn sources_are_addresses_and_ipv6_networks() {
        assert_eq!(source_key(ip("192.0.2.1")), ip("192.0.2.1"));
        assert_eq!(source_key(ip("::ffff:192.0.2.1")), ip("192.0.2.1"));
        assert_eq!(source_key(ip("2001:db8:1:2::5")), ip("2001:db8:1:2::"));
        assert_eq!(
            source_key(ip("2001:db8:1:2:ffff:ffff:ffff:ffff")),
            ip("2001:db8:1:2::")
        );
        assert_ne!(source_key(ip("2001:db8:1:3::5")), ip("2001:db8:1:2::"));
        // One /64 is one source: its addresses share the quota.
        let mut s = Activations::new(DeviceAllowlist::default(), Duration::from_secs(600), 16, 2);
        let t = Instant::now();
        let mut rng = counter();
        for (i, ms) in (0..5_u64).enumerate() {
            let source = ip(&format!("2001:db8:1:2::{}", i + 1));
            pending(s.ota(
                t + Duration::from_millis(ms),
                from(source, &device(i), CLIENT),
                &mut rng,
            ));
        }
        let listed = s.pending(t + Duration::from_secs(1));
        assert_eq!(listed.len(), 2);
        assert!(listed.iter().all(|p| p.address == "2001:db8:1:2::"));
    }

    #[test]
    fn id_validation() {
        assert!(valid_id(DEV));
        assert!(!valid_id(""));
        assert!(!valid_id("a|b"));
        assert!(!valid_id("a\u{0}"));
        assert!(!valid_id(&"x".repeat(MAX_ID_BYTES + 1)));
        assert!(valid_id(&"x".repeat(MAX_ID_BYTES)));
    }
}
