//! Tuning of endpointing, interruption and playback tracking.

use std::time::Duration;

/// Configuration of a [`crate::TurnMachine`]. Plain data: build it with struct update syntax
/// over [`Config::default`].
///
/// The defaults are chosen to beat the figures reported for Pipecat and LiveKit Agents
/// (see `shared/notes/turn-taking.md`): their users' top complaints are end-of-turn delays of
/// 700–800 ms and false barge-in. VAD hysteresis (start/stop durations, confidence, volume,
/// backbuffer) is the VAD's business and happens before [`crate::Input::SpeechStarted`] /
/// [`crate::Input::SpeechStopped`]; everything here comes after it.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Endpointing: silence after the VAD's end of speech before the user turn ends when the
    /// turn looks finished (a final transcript is in, or a turn model says so).
    ///
    /// Default 100 ms. With the VAD's default 200 ms stop duration a turn ends 300 ms after
    /// the user's last voiced frame, and with prompt providers the first reply audio follows
    /// about 330 ms after it (the Xiaozhi reference server: about 375 ms; LiveKit waits
    /// 500 ms on top of its VAD's 550 ms). A pause in the middle of a sentence shorter than
    /// that stays one turn (a possible onset the VAD has not confirmed holds the endpoint, see
    /// [`crate::Input::SpeechOnset`]); a longer one ends the turn, and the user's next words
    /// interrupt the reply. `docs/engine.md` has the measured trade-off.
    pub min_endpoint_delay: Duration,
    /// Endpointing: the longest wait after end of speech, used while the recognizer has not
    /// finalized the last words or a turn model predicts the user will go on.
    ///
    /// Default 2 s (LiveKit and Pipecat's Smart Turn cap at 3 s).
    pub max_endpoint_delay: Duration,
    /// A turn-model probability at or above this ends the turn after `min_endpoint_delay`;
    /// below it the machine waits `max_endpoint_delay`. Default 0.5.
    pub end_of_turn_threshold: f32,
    /// Interruption policy: user speech must last this long while the system holds the floor
    /// before it counts as a barge-in.
    ///
    /// Default 300 ms (LiveKit needs 500 ms). A shorter threshold is affordable because a
    /// false interruption is repaired by resuming the reply ([`Config::resume_false_interruptions`]).
    pub min_interruption_speech: Duration,
    /// Interruption policy: transcript words needed, in addition to the speech duration, before
    /// a barge-in counts (Pipecat's min-words strategy). 0 disables the check (LiveKit's
    /// default). CJK characters count one word each. Default 0.
    pub min_interruption_words: u32,
    /// False interruption: if an interruption produced no words this long after the user's
    /// speech stopped, it was noise or the agent hearing itself.
    ///
    /// Default 1.5 s (LiveKit waits 2 s). Needs a recognizer: sessions that never feed
    /// [`crate::Input::Words`] cannot tell noise from speech and never resume.
    pub false_interruption_timeout: Duration,
    /// Re-send the unheard rest of a reply cut off by a false interruption. Default true.
    pub resume_false_interruptions: bool,
    /// After a reply that asked the user something, how long Listening waits for speech before
    /// going back to Idle. Default 8 s.
    pub listen_timeout: Duration,
    /// The client sends playback position reports (`supports_playback_reporting`); otherwise
    /// the position is estimated from delivery times and chunk durations. Default false.
    pub playback_reports: bool,
    /// With reports on, how long past the estimated end of playback the machine waits for the
    /// final report before treating playback as finished (reports can be lost or late).
    /// Default 1 s.
    pub playback_report_grace: Duration,
    /// A client abort (or push-to-talk press) stops even uninterruptible speech: it is a
    /// deliberate act, and Xiaozhi devices keep speaking until told to stop. Default true.
    pub abort_overrides_uninterruptible: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            min_endpoint_delay: Duration::from_millis(100),
            max_endpoint_delay: Duration::from_secs(2),
            end_of_turn_threshold: 0.5,
            min_interruption_speech: Duration::from_millis(300),
            min_interruption_words: 0,
            false_interruption_timeout: Duration::from_millis(1500),
            resume_false_interruptions: true,
            listen_timeout: Duration::from_secs(8),
            playback_reports: false,
            playback_report_grace: Duration::from_secs(1),
            abort_overrides_uninterruptible: true,
        }
    }
}
