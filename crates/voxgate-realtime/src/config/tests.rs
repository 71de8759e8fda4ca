use super::*;
use crate::proto::Duration as WireDuration;

fn audio(rate: u32, channels: u32, format: SampleFormat) -> AudioLineConfiguration {
    AudioLineConfiguration {
        sample_rate: rate,
        channel_count: channels,
        sample_format: format.into(),
    }
}

fn ms(millis: u32) -> Option<WireDuration> {
    Some(WireDuration {
        seconds: 0,
        nanos: millis * 1_000_000,
    })
}

fn request() -> InitializeSessionRequest {
    InitializeSessionRequest {
        input_audio_line: Some(audio(16_000, 1, SampleFormat::Signed16Bit)),
        output_audio_line: Some(audio(24_000, 1, SampleFormat::Signed16Bit)),
        ..Default::default()
    }
}

/// Parses `request()` after `edit` and returns the error's field and problem.
fn config_error(edit: impl FnOnce(&mut InitializeSessionRequest)) -> (String, ConfigProblem) {
    let mut r = request();
    edit(&mut r);
    let err = SessionConfig::from_wire(&r).unwrap_err();
    assert_eq!(
        crate::Error::from(err.clone()).category(),
        proto::SessionErrorCategory::ErrorConfiguration
    );
    assert!(err.to_string().starts_with(err.field()), "{err}");
    (err.field().to_owned(), err.problem().clone())
}

fn vad(edit: impl FnOnce(&mut VadConfiguration)) -> (String, ConfigProblem) {
    config_error(|r| {
        let mut v = VadConfiguration::default();
        edit(&mut v);
        r.vad_configuration = Some(v);
    })
}

fn eleven_labs() -> ElevenLabsTtsConfiguration {
    ElevenLabsTtsConfiguration {
        api_key: "key".into(),
        voice_id: "voice".into(),
        ..Default::default()
    }
}

fn tts(provider: Option<tts_configuration::Provider>) -> (String, ConfigProblem) {
    config_error(|r| r.tts_configuration = Some(TtsConfiguration { provider }))
}

fn voice_settings(edit: impl FnOnce(&mut ElevenLabsVoiceSettings)) -> (String, ConfigProblem) {
    let mut vs = ElevenLabsVoiceSettings {
        stability: 0.5,
        similarity_boost: 0.5,
        style: 0.0,
        use_speaker_boost: false,
        speed: 1.0,
    };
    edit(&mut vs);
    let mut e = eleven_labs();
    e.voice_settings = Some(vs);
    tts(Some(tts_configuration::Provider::ElevenLabs(e)))
}

#[test]
fn minimal_request_gets_documented_defaults() {
    let config = SessionConfig::from_wire(&request()).unwrap();
    assert_eq!(config.input, AudioFormat::SPEECH_16K);
    assert_eq!(config.output, AudioFormat::SPEECH_24K);
    assert_eq!(config.vad, VadSettings::default());
    assert_eq!(config.vad.confidence_threshold(), 0.4);
    assert_eq!(config.vad.start_duration(), Duration::from_millis(150));
    assert_eq!(config.vad.stop_duration(), Duration::from_millis(390));
    assert_eq!(config.vad.backbuffer_duration(), Duration::from_secs(1));
    assert_eq!(config.inference.temperature(), 0.3);
    assert_eq!(config.inference.system_prompt(), "");
    assert_eq!(config.tts, None);
    assert!(config.experiments.is_empty());
}

#[test]
fn zero_vad_fields_mean_defaults() {
    let mut r = request();
    r.vad_configuration = Some(VadConfiguration {
        confidence_threshold: 0.0,
        min_volume: 0.0,
        start_duration: Some(WireDuration::default()),
        stop_duration: None,
        backbuffer_duration: Some(WireDuration::default()),
    });
    let config = SessionConfig::from_wire(&r).unwrap();
    assert_eq!(config.vad, VadSettings::default());
}

#[test]
fn explicit_values_are_kept() {
    let mut r = request();
    r.vad_configuration = Some(VadConfiguration {
        confidence_threshold: 0.75,
        min_volume: 0.5,
        start_duration: ms(100),
        stop_duration: Some(WireDuration {
            seconds: 2,
            nanos: 5,
        }),
        backbuffer_duration: ms(250),
    });
    r.inference_configuration = Some(InferenceConfiguration {
        system_prompt: "p".into(),
        temperature: 0.0,
    });
    let config = SessionConfig::from_wire(&r).unwrap();
    assert_eq!(config.vad.confidence_threshold(), 0.75);
    assert_eq!(config.vad.min_volume(), 0.5);
    assert_eq!(config.vad.start_duration(), Duration::from_millis(100));
    assert_eq!(config.vad.stop_duration(), Duration::new(2, 5));
    assert_eq!(config.vad.backbuffer_duration(), Duration::from_millis(250));
    // A present configuration is literal: temperature 0 is deterministic, not "unset".
    assert_eq!(config.inference.temperature(), 0.0);
    assert_eq!(config.inference.system_prompt(), "p");
}

#[test]
fn audio_lines_are_required() {
    assert_eq!(
        config_error(|r| r.input_audio_line = None),
        ("input_audio_line".into(), ConfigProblem::Missing)
    );
    assert_eq!(
        config_error(|r| r.output_audio_line = None),
        ("output_audio_line".into(), ConfigProblem::Missing)
    );
}

#[test]
fn bad_sample_rates() {
    for rate in [0, 1, 7_999, 192_001, u32::MAX] {
        let (field, problem) =
            config_error(|r| r.input_audio_line = Some(audio(rate, 1, SampleFormat::Signed16Bit)));
        assert_eq!(field, "input_audio_line.sample_rate");
        assert_eq!(
            problem,
            ConfigProblem::OutOfRange {
                value: rate.to_string(),
                accepted: "8000..=192000"
            }
        );
    }
    for rate in [8_000, 44_100, 192_000] {
        assert!(AudioFormat::new(rate, 1, SampleFormat::Signed16Bit).is_ok());
    }
}

#[test]
fn bad_channel_counts() {
    for channels in [0, 9, 65_536, u32::MAX] {
        let (field, problem) = config_error(|r| {
            r.output_audio_line = Some(audio(24_000, channels, SampleFormat::Float32Bit));
        });
        assert_eq!(field, "output_audio_line.channel_count");
        assert!(matches!(problem, ConfigProblem::OutOfRange { .. }));
    }
}

#[test]
fn unknown_sample_format() {
    let (field, problem) = config_error(|r| {
        r.input_audio_line = Some(AudioLineConfiguration {
            sample_rate: 16_000,
            channel_count: 1,
            sample_format: 5,
        });
    });
    assert_eq!(field, "input_audio_line.sample_format");
    assert_eq!(problem, ConfigProblem::UnknownEnumValue(5));
}

#[test]
fn bad_vad_thresholds() {
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        assert_eq!(
            vad(|v| v.confidence_threshold = bad),
            (
                "vad_configuration.confidence_threshold".into(),
                ConfigProblem::NotFinite
            )
        );
        assert_eq!(
            vad(|v| v.min_volume = bad),
            (
                "vad_configuration.min_volume".into(),
                ConfigProblem::NotFinite
            )
        );
    }
    for bad in [-0.1, 1.5, -1.0] {
        let (field, problem) = vad(|v| v.confidence_threshold = bad);
        assert_eq!(field, "vad_configuration.confidence_threshold");
        assert!(matches!(problem, ConfigProblem::OutOfRange { .. }));
        let (field, problem) = vad(|v| v.min_volume = bad);
        assert_eq!(field, "vad_configuration.min_volume");
        assert!(matches!(problem, ConfigProblem::OutOfRange { .. }));
    }
}

#[test]
fn bad_vad_durations() {
    let huge = Some(WireDuration {
        seconds: 3_601,
        nanos: 0,
    });
    let bad_nanos = Some(WireDuration {
        seconds: 0,
        nanos: 1_000_000_000,
    });
    type Setter = fn(&mut VadConfiguration, Option<WireDuration>);
    let fields: [(&str, Setter); 3] = [
        ("start_duration", |v, d| v.start_duration = d),
        ("stop_duration", |v, d| v.stop_duration = d),
        ("backbuffer_duration", |v, d| v.backbuffer_duration = d),
    ];
    for (name, set) in fields {
        let (field, problem) = vad(|v| set(v, huge));
        assert_eq!(field, format!("vad_configuration.{name}"));
        assert!(matches!(problem, ConfigProblem::OutOfRange { .. }));
        assert_eq!(
            vad(|v| set(v, bad_nanos)),
            (
                format!("vad_configuration.{name}.nanos"),
                ConfigProblem::NanosOutOfRange(1_000_000_000)
            )
        );
    }
}

/// Each window has its own maximum: exactly the maximum is accepted, one nanosecond more is an
/// `ERROR_CONFIGURATION` naming the field and the accepted range (and no detector is built).
#[test]
fn vad_windows_are_bounded() {
    type Setter = fn(&mut VadConfiguration, Option<WireDuration>);
    let fields: [(&str, Setter, Duration, &str); 3] = [
        (
            "start_duration",
            |v, d| v.start_duration = d,
            VadSettings::MAX_START_DURATION,
            "(0s, 2s]",
        ),
        (
            "stop_duration",
            |v, d| v.stop_duration = d,
            VadSettings::MAX_STOP_DURATION,
            "(0s, 10s]",
        ),
        (
            "backbuffer_duration",
            |v, d| v.backbuffer_duration = d,
            VadSettings::MAX_BACKBUFFER_DURATION,
            "(0s, 3s]",
        ),
    ];
    for (name, set, max, accepted) in fields {
        let mut r = request();
        let mut v = VadConfiguration::default();
        set(&mut v, Some(max.into()));
        r.vad_configuration = Some(v);
        let config = SessionConfig::from_wire(&r).unwrap();
        assert_eq!(
            VadSettings::from_wire(Some(&config.vad.to_wire())),
            Ok(config.vad),
            "{name} at its maximum survives the wire"
        );

        let over = max + Duration::from_nanos(1);
        let (field, problem) = vad(|v| set(v, Some(over.into())));
        assert_eq!(field, format!("vad_configuration.{name}"));
        assert_eq!(
            problem,
            ConfigProblem::OutOfRange {
                value: format!("{over:?}"),
                accepted
            }
        );
    }
    // The published client's defaults fit.
    let d = VadSettings::default();
    assert!(d.start_duration() <= VadSettings::MAX_START_DURATION);
    assert!(d.backbuffer_duration() <= VadSettings::MAX_BACKBUFFER_DURATION);
    // The message a client reads.
    let mut r = request();
    r.vad_configuration = Some(VadConfiguration {
        backbuffer_duration: Some(WireDuration {
            seconds: 60,
            nanos: 0,
        }),
        ..Default::default()
    });
    let err = crate::Error::from(SessionConfig::from_wire(&r).unwrap_err());
    let note = err.to_notification();
    assert_eq!(
        note.category,
        i32::from(proto::SessionErrorCategory::ErrorConfiguration)
    );
    assert_eq!(
        note.message,
        "vad_configuration.backbuffer_duration: 60s is outside the accepted range (0s, 3s]"
    );
}

#[test]
fn system_prompt_is_bounded() {
    let prompt = |len: usize| InferenceConfiguration {
        system_prompt: "x".repeat(len),
        temperature: 0.3,
    };
    let mut r = request();
    r.inference_configuration = Some(prompt(InferenceSettings::MAX_SYSTEM_PROMPT_BYTES));
    assert!(SessionConfig::from_wire(&r).is_ok());
    let (field, problem) = config_error(|r| {
        r.inference_configuration = Some(prompt(InferenceSettings::MAX_SYSTEM_PROMPT_BYTES + 1));
    });
    assert_eq!(field, "inference_configuration.system_prompt");
    assert_eq!(
        problem,
        ConfigProblem::TooLarge {
            len: limits::MAX_SYSTEM_PROMPT_BYTES + 1,
            max: limits::MAX_SYSTEM_PROMPT_BYTES,
            unit: "bytes"
        }
    );
    assert_eq!(
        problem.to_string(),
        "131073 bytes is more than the maximum of 131072 bytes"
    );
    // The same bound for a reconfiguration, which changes nothing when refused.
    let update = ReconfigureSessionRequest {
        input_audio_line: None,
        inference_configuration: Some(prompt(limits::MAX_SYSTEM_PROMPT_BYTES + 1)),
    };
    let err = SessionUpdate::from_wire(&update).unwrap_err();
    assert_eq!(err.field(), "inference_configuration.system_prompt");
    assert_eq!(
        err.category(),
        proto::SessionErrorCategory::ErrorConfiguration
    );
    assert!(InferenceSettings::new("x".repeat(limits::MAX_SYSTEM_PROMPT_BYTES + 1), 0.3).is_err());
}

#[test]
fn input_rate_is_bounded_on_reconfiguration() {
    let update = ReconfigureSessionRequest {
        input_audio_line: Some(audio(
            AudioFormat::MAX_SAMPLE_RATE + 1,
            1,
            SampleFormat::Signed16Bit,
        )),
        inference_configuration: None,
    };
    let err = SessionUpdate::from_wire(&update).unwrap_err();
    assert_eq!(err.field(), "input_audio_line.sample_rate");
    let ok = ReconfigureSessionRequest {
        input_audio_line: Some(audio(
            AudioFormat::MAX_SAMPLE_RATE,
            1,
            SampleFormat::Signed16Bit,
        )),
        inference_configuration: None,
    };
    assert!(SessionUpdate::from_wire(&ok).is_ok());
}

#[test]
fn experiments_are_bounded() {
    let value = prost_types::Value {
        kind: Some(prost_types::value::Kind::BoolValue(true)),
    };
    let mut r = request();
    r.experiments = (0..limits::MAX_EXPERIMENTS)
        .map(|i| (format!("e{i}"), value.clone()))
        .collect();
    assert!(SessionConfig::from_wire(&r).is_ok());
    let (field, problem) = config_error(|r| {
        r.experiments = (0..=limits::MAX_EXPERIMENTS)
            .map(|i| (format!("e{i}"), value.clone()))
            .collect();
    });
    assert_eq!(field, "experiments");
    assert!(matches!(
        problem,
        ConfigProblem::TooLarge {
            len: 65,
            max: 64,
            ..
        }
    ));
}

#[test]
fn vad_new_rejects_zero_windows() {
    let d = Duration::from_millis(100);
    assert!(VadSettings::new(0.5, 0.0, d, d, d).is_ok());
    assert_eq!(
        VadSettings::new(0.5, 0.0, d, d, Duration::ZERO)
            .unwrap_err()
            .field(),
        "backbuffer_duration"
    );
    assert_eq!(
        VadSettings::new(0.5, 0.0, Duration::ZERO, d, d)
            .unwrap_err()
            .field(),
        "start_duration"
    );
    assert_eq!(
        VadSettings::new(0.0, 0.0, d, d, d).unwrap_err().field(),
        "confidence_threshold"
    );
}

#[test]
fn bad_temperatures() {
    for bad in [f64::NAN, f64::INFINITY, -0.5, 2.01, 1e300] {
        let (field, problem) = config_error(|r| {
            r.inference_configuration = Some(InferenceConfiguration {
                system_prompt: String::new(),
                temperature: bad,
            });
        });
        assert_eq!(field, "inference_configuration.temperature");
        assert!(matches!(
            problem,
            ConfigProblem::NotFinite | ConfigProblem::OutOfRange { .. }
        ));
    }
}

#[test]
fn tts_needs_a_provider() {
    assert_eq!(
        tts(None),
        ("tts_configuration.provider".into(), ConfigProblem::Missing)
    );
}

#[test]
fn eleven_labs_fields() {
    let mut e = eleven_labs();
    e.api_key.clear();
    assert_eq!(
        tts(Some(tts_configuration::Provider::ElevenLabs(e))),
        (
            "tts_configuration.eleven_labs.api_key".into(),
            ConfigProblem::Empty
        )
    );
    let mut e = eleven_labs();
    e.voice_id.clear();
    assert_eq!(
        tts(Some(tts_configuration::Provider::ElevenLabs(e))).0,
        "tts_configuration.eleven_labs.voice_id"
    );
    let mut e = eleven_labs();
    e.model_id = Some(String::new());
    assert_eq!(
        tts(Some(tts_configuration::Provider::ElevenLabs(e))).0,
        "tts_configuration.eleven_labs.model_id"
    );
    let mut e = eleven_labs();
    e.location = 3;
    assert_eq!(
        tts(Some(tts_configuration::Provider::ElevenLabs(e))),
        (
            "tts_configuration.eleven_labs.location".into(),
            ConfigProblem::UnknownEnumValue(3)
        )
    );
}

#[test]
fn bad_voice_settings() {
    type Setter = fn(&mut ElevenLabsVoiceSettings, f64);
    let fields: [(&str, Setter); 4] = [
        ("stability", |v, x| v.stability = x),
        ("similarity_boost", |v, x| v.similarity_boost = x),
        ("style", |v, x| v.style = x),
        ("speed", |v, x| v.speed = x),
    ];
    for (name, set) in fields {
        for bad in [f64::NAN, -1.0, 5.0] {
            let (field, _) = voice_settings(|v| set(v, bad));
            assert_eq!(
                field,
                format!("tts_configuration.eleven_labs.voice_settings.{name}")
            );
        }
    }
    // Speed 0 is "unset": normal speed.
    let mut e = eleven_labs();
    e.voice_settings = Some(ElevenLabsVoiceSettings::default());
    let settings = ElevenLabsSettings::from_wire(&e).unwrap();
    assert_eq!(settings.voice_settings().unwrap().speed(), 1.0);
}

#[test]
fn hosted_fields() {
    let hosted = |voice, mode| {
        tts(Some(tts_configuration::Provider::Hosted(
            HostedTtsConfiguration { voice, mode },
        )))
    };
    assert_eq!(
        hosted(None, 0),
        (
            "tts_configuration.hosted.voice".into(),
            ConfigProblem::Missing
        )
    );
    assert_eq!(
        hosted(
            Some(hosted_tts_configuration::Voice::VoiceRef(
                HostedVoiceRef::default()
            )),
            0
        )
        .0,
        "tts_configuration.hosted.voice_ref.voice_id"
    );
    let voice_ref = Some(hosted_tts_configuration::Voice::VoiceRef(HostedVoiceRef {
        voice_id: "nova".into(),
    }));
    assert_eq!(
        hosted(voice_ref, 2),
        (
            "tts_configuration.hosted.mode".into(),
            ConfigProblem::UnknownEnumValue(2)
        )
    );
    let clone = |audio: &'static [u8], format| {
        Some(hosted_tts_configuration::Voice::VoiceCloneV1(
            HostedVoiceCloneV1 {
                audio_data: Bytes::from_static(audio),
                audio_format: format,
                ref_text: "hi".into(),
            },
        ))
    };
    assert_eq!(
        hosted(clone(&[0, 0], None), 0),
        (
            "tts_configuration.hosted.voice_clone_v1.audio_format".into(),
            ConfigProblem::Missing
        )
    );
    assert_eq!(
        hosted(
            clone(
                &[0, 0, 0],
                Some(audio(16_000, 1, SampleFormat::Signed16Bit))
            ),
            0
        ),
        (
            "tts_configuration.hosted.voice_clone_v1.audio_data".into(),
            ConfigProblem::AudioLength { len: 3, frame: 2 }
        )
    );
    assert_eq!(
        hosted(
            clone(&[], Some(audio(16_000, 1, SampleFormat::Signed16Bit))),
            0
        )
        .1,
        ConfigProblem::AudioLength { len: 0, frame: 2 }
    );
    assert_eq!(
        hosted(
            clone(&[0; 4], Some(audio(16_000, 0, SampleFormat::Signed16Bit))),
            0
        )
        .0,
        "tts_configuration.hosted.voice_clone_v1.audio_format.channel_count"
    );
}

#[test]
fn experiments_must_have_json() {
    let (field, problem) = config_error(|r| {
        r.experiments.insert(
            "bad".into(),
            prost_types::Value {
                kind: Some(prost_types::value::Kind::NumberValue(f64::NAN)),
            },
        );
    });
    assert_eq!(field, "experiments.bad");
    assert!(matches!(
        problem,
        ConfigProblem::Json(StructError::NonFiniteNumber { .. })
    ));
}

#[test]
fn session_config_round_trips_through_the_wire() {
    let mut config = SessionConfig::new(AudioFormat::SPEECH_16K, AudioFormat::SPEECH_24K);
    config.vad = VadSettings::new(
        0.6,
        0.1,
        Duration::from_millis(120),
        Duration::from_millis(600),
        Duration::from_secs(2),
    )
    .unwrap();
    config.inference = InferenceSettings::new("Be kind.", 1.0).unwrap();
    config.tts = Some(TtsSettings::ElevenLabs(
        ElevenLabsSettings::new("k", "v")
            .unwrap()
            .with_model_id("m")
            .unwrap()
            .with_location(ElevenLabsLocation::India)
            .with_voice_settings(VoiceSettings::new(0.1, 0.2, 0.3, true, 0.9).unwrap()),
    ));
    config.supports_playback_reporting = true;
    config
        .experiments
        .insert("x".into(), serde_json::json!({"a": [1, null]}));
    let wire = config.to_wire().unwrap();
    assert_eq!(SessionConfig::from_wire(&wire).unwrap(), config);
}

#[test]
fn hosted_round_trip() {
    let clone = VoiceClone::new(
        Bytes::from_static(&[1, 2, 3, 4]),
        AudioFormat::SPEECH_16K,
        "ref",
    )
    .unwrap();
    let tts = TtsSettings::Hosted(HostedTtsSettings {
        voice: HostedVoice::Clone(clone),
        mode: HostedTtsMode::LowLatency,
    });
    assert_eq!(TtsSettings::from_wire(&tts.to_wire()).unwrap(), tts);
}

#[test]
fn reconfigure() {
    let update = SessionUpdate::from_wire(&ReconfigureSessionRequest::default()).unwrap();
    assert_eq!(update, SessionUpdate::default());
    let err = SessionUpdate::from_wire(&ReconfigureSessionRequest {
        input_audio_line: Some(audio(4_000, 1, SampleFormat::Signed16Bit)),
        inference_configuration: None,
    })
    .unwrap_err();
    assert_eq!(err.field(), "input_audio_line.sample_rate");
    let err = SessionUpdate::from_wire(&ReconfigureSessionRequest {
        input_audio_line: None,
        inference_configuration: Some(InferenceConfiguration {
            system_prompt: String::new(),
            temperature: -1.0,
        }),
    })
    .unwrap_err();
    assert_eq!(err.field(), "inference_configuration.temperature");

    let mut config = SessionConfig::new(AudioFormat::SPEECH_16K, AudioFormat::SPEECH_24K);
    let update = SessionUpdate {
        input: Some(AudioFormat::new(48_000, 2, SampleFormat::Float32Bit).unwrap()),
        inference: None,
    };
    assert_eq!(SessionUpdate::from_wire(&update.to_wire()).unwrap(), update);
    update.apply(&mut config);
    assert_eq!(config.input.sample_rate(), 48_000);
    assert_eq!(config.inference, InferenceSettings::default());
}

#[test]
fn durations_convert_exactly() {
    let d = Duration::new(12, 345_678_901);
    let wire = WireDuration::from(d);
    assert_eq!(
        wire,
        WireDuration {
            seconds: 12,
            nanos: 345_678_901
        }
    );
    assert_eq!(Duration::try_from(wire).unwrap(), d);
    let max = WireDuration {
        seconds: u64::MAX,
        nanos: 999_999_999,
    };
    assert_eq!(max.to_std().unwrap(), Duration::MAX);
    assert_eq!(
        Duration::try_from(WireDuration {
            seconds: 0,
            nanos: u32::MAX
        })
        .unwrap_err()
        .problem(),
        &ConfigProblem::NanosOutOfRange(u32::MAX)
    );
}

#[test]
fn audio_format_arithmetic() {
    let f = AudioFormat::new(16_000, 2, SampleFormat::Signed16Bit).unwrap();
    assert_eq!(f.bytes_per_sample(), 2);
    assert_eq!(f.bytes_per_frame(), 4);
    assert_eq!(f.bytes_per_second(), 64_000);
    assert_eq!(f.duration_of(64_000), Duration::from_secs(1));
    assert_eq!(f.duration_of(64_003), Duration::from_secs(1));
    assert_eq!(f.duration_of(640), Duration::from_millis(10));
    assert_eq!(f.bytes_for(Duration::from_millis(20)), 1_280);
    assert_eq!(f.bytes_for(Duration::MAX), u64::MAX);
    let f64le = AudioFormat::new(192_000, 8, SampleFormat::Float64Bit).unwrap();
    assert_eq!(f64le.bytes_per_frame(), 64);
    assert_eq!(
        f64le.duration_of(u64::MAX),
        Duration::new(1_501_199_875_790, 165_328_125)
    );
    assert_eq!(
        AudioFormat::SPEECH_24K.to_wire(),
        audio(24_000, 1, SampleFormat::Signed16Bit)
    );
}

#[test]
fn api_key_is_not_logged() {
    let settings = ElevenLabsSettings::new("sk_secret", "voice").unwrap();
    let debug = format!("{settings:?}");
    assert!(!debug.contains("sk_secret"), "{debug}");
    assert_eq!(settings.api_key(), "sk_secret");
}
