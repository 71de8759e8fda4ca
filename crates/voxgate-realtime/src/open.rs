//! Enum fields as open enums: known values typed, unknown values kept.
//!
//! prost stores enum fields as `i32`, and the getters it derives (such as
//! `AudioLineConfiguration::sample_format()`) silently turn an unknown value into the enum's
//! default. A newer peer's value would then masquerade as `UNSIGNED_8_BIT` or `ERROR_UNKNOWN`.
//! The `*_open()` accessors in this module return an [`Open`] instead, so the caller decides
//! what an unknown value means.

use crate::proto::{
    AudioLineConfiguration, ChatDeliveryStatus, ChatMessage, ChatMessageRole, ElevenLabsLocation,
    ElevenLabsTtsConfiguration, HostedTtsConfiguration, HostedTtsMode, InferenceTriggerMode,
    SampleFormat, SessionErrorCategory, SessionErrorNotification, UserInput, VadAnalysisFrame,
    VadState, VadStateEvent,
};

/// The value of a protobuf enum field: a variant this crate knows, or the raw number it does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Open<E> {
    /// A value defined in `realtime.proto`.
    Known(E),
    /// A value this version does not define, probably from a newer peer.
    Unknown(i32),
}

impl<E: TryFrom<i32>> Open<E> {
    /// Classifies a raw wire value.
    #[must_use]
    pub fn from_raw(raw: i32) -> Self {
        E::try_from(raw).map_or(Self::Unknown(raw), Self::Known)
    }
}

impl<E> Open<E> {
    /// The known value, if it is one.
    #[must_use]
    pub fn known(self) -> Option<E> {
        match self {
            Self::Known(e) => Some(e),
            Self::Unknown(_) => None,
        }
    }

    /// Whether the value is one this crate knows.
    #[must_use]
    pub fn is_known(&self) -> bool {
        matches!(self, Self::Known(_))
    }
}

impl<E: Into<i32>> Open<E> {
    /// The raw wire value.
    #[must_use]
    pub fn raw(self) -> i32 {
        match self {
            Self::Known(e) => e.into(),
            Self::Unknown(raw) => raw,
        }
    }
}

impl<E> From<E> for Open<E> {
    fn from(e: E) -> Self {
        Self::Known(e)
    }
}

/// Defines `<field>_open()` accessors next to prost's coercing getters.
macro_rules! open_accessors {
    ($($message:ty { $($field:ident => $accessor:ident: $enum:ty),+ $(,)? })+) => {$(
        impl $message {
            $(
                #[doc = concat!(
                    "The `", stringify!($field), "` field as an [`Open`] enum: unlike prost's `",
                    stringify!($field), "()`, an unknown value stays visible as `Open::Unknown`."
                )]
                #[must_use]
                pub fn $accessor(&self) -> Open<$enum> {
                    Open::from_raw(self.$field)
                }
            )+
        }
    )+};
}

open_accessors! {
    AudioLineConfiguration { sample_format => sample_format_open: SampleFormat }
    VadAnalysisFrame { state => state_open: VadState }
    VadStateEvent {
        from_state => from_state_open: VadState,
        to_state => to_state_open: VadState,
    }
    ElevenLabsTtsConfiguration { location => location_open: ElevenLabsLocation }
    HostedTtsConfiguration { mode => mode_open: HostedTtsMode }
    UserInput { mode => mode_open: InferenceTriggerMode }
    ChatMessage {
        role => role_open: ChatMessageRole,
        delivery_status => delivery_status_open: ChatDeliveryStatus,
    }
    SessionErrorNotification { category => category_open: SessionErrorCategory }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_values_are_kept() {
        let cfg = AudioLineConfiguration {
            sample_rate: 16_000,
            channel_count: 1,
            sample_format: 99,
        };
        assert_eq!(cfg.sample_format_open(), Open::Unknown(99));
        assert_eq!(cfg.sample_format_open().raw(), 99);
        assert_eq!(cfg.sample_format_open().known(), None);
        // prost's own getter coerces; this is the behaviour the accessor exists to avoid.
        assert_eq!(cfg.sample_format(), SampleFormat::Unsigned8Bit);
    }

    #[test]
    fn known_values_are_typed() {
        let frame = VadAnalysisFrame {
            state: VadState::SpeechEnding.into(),
            ..Default::default()
        };
        assert_eq!(frame.state_open(), Open::Known(VadState::SpeechEnding));
        assert!(frame.state_open().is_known());
        assert_eq!(Open::from(VadState::Speech).raw(), 2);
        assert_eq!(Open::<VadState>::from_raw(-1), Open::Unknown(-1));
    }
}
