//! espeak-ng's library as PyPI's `espeakng-loader` 0.2.4 installs it (espeak-ng 1.52.0), from
//! the models directory `cargo xtask models` / `cargo xtask offline` fill: `VOXGATE_MODELS_DIR`,
//! else the workspace's `target/models`. Each test says so and passes when it is not there.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may unwrap and panic

use std::path::{Path, PathBuf};

use voxgate_espeak::{Espeak, EspeakError, MAX_TEXT_BYTES, data_beside};

/// The installed library, or `None` (with a message) when it is not installed.
fn installed() -> Option<PathBuf> {
    let dir = std::env::var_os("VOXGATE_MODELS_DIR")
        .filter(|d| !d.is_empty())
        .map_or_else(
            || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/models"),
            PathBuf::from,
        );
    let package = dir.join("espeakng_loader");
    let mut libs: Vec<PathBuf> = std::fs::read_dir(&package)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libespeak-ng.so") || n.ends_with(".dylib"))
        })
        .collect();
    libs.sort();
    let found = libs.pop();
    if found.is_none() {
        eprintln!(
            "skipped: espeak-ng's library is not installed in {} (cargo xtask models --dir \
             target/models, or cargo xtask offline)",
            package.display()
        );
    }
    found
}

fn load() -> Option<Espeak> {
    let library = installed()?;
    let data = data_beside(&library).expect("espeak-ng-data beside the library");
    Some(Espeak::load(&library, Some(&data)).unwrap())
}

#[test]
fn phonemizes_clauses_as_espeak_ng_1_52_does() {
    let Some(espeak) = load() else { return };
    assert_eq!(espeak.version(), "1.52.0", "these phonemes are 1.52.0's");
    // Each case: the text, and the clauses `espeak-ng -q --ipa -v en-us` prints for it.
    let cases: &[(&str, &[&str])] = &[
        (
            "Hello, how are you today?",
            &["həlˈoʊ", "hˌaʊ ɑːɹ juː tədˈeɪ"],
        ),
        // A lone function word keeps the program's stress (not espeak_TextToPhonemes' ˌ).
        ("What?", &["wˈʌt"]),
        (
            "Pi is 3.14, e.g. roughly.",
            &["pˈaɪ ɪz θɹˈiː pɔɪnt wˈʌn fˈɔːɹ", "fˌɔːɹɛɡzˈæmpəl ɹˈʌfli"],
        ),
        ("Mr. Smith", &["mˈɪstɚ", "smˈɪθ"]),
        ("One, two, three.", &["wˈʌn", "tˈuː", "θɹˈiː"]),
    ];
    for (text, clauses) in cases {
        assert_eq!(espeak.phonemize("en-us", text).unwrap(), *clauses, "{text}");
    }
}

#[test]
fn one_instance_per_process() {
    let Some(espeak) = load() else { return };
    let library = installed().unwrap();
    // The same library again is the same instance.
    let again = Espeak::load(&library, data_beside(&library).as_deref()).unwrap();
    assert_eq!(again, espeak);
    // Another data directory cannot be used beside it.
    let err = Espeak::load(&library, None).unwrap_err();
    assert!(matches!(err, EspeakError::AlreadyLoaded { .. }), "{err:?}");
    assert!(err.to_string().contains("already loaded"), "{err}");
}

#[test]
fn voices_switch_per_call_and_unknown_ones_are_errors() {
    let Some(espeak) = load() else { return };
    let english = espeak.phonemize("en-us", "Hello").unwrap();
    let german = espeak.phonemize("de", "Hallo").unwrap();
    assert_eq!(german, ["hˈaloː"]);
    // By language when no voice has the name, as `espeak-ng -v` does.
    assert_eq!(espeak.phonemize("en-US", "Hello").unwrap(), english);
    assert_eq!(espeak.phonemize("en-us", "Hello").unwrap(), english);
    let err = espeak.phonemize("xx-no-such-voice", "Hello").unwrap_err();
    assert!(
        matches!(&err, EspeakError::Voice { voice, .. } if voice == "xx-no-such-voice"),
        "{err:?}"
    );
    // A failed switch leaves espeak-ng usable.
    assert_eq!(espeak.phonemize("en-us", "Hello").unwrap(), english);
}

#[test]
fn input_beyond_the_bounds_is_refused_not_cut() {
    let Some(espeak) = load() else { return };
    let long = "a ".repeat(MAX_TEXT_BYTES);
    let err = espeak.phonemize("en-us", &long).unwrap_err();
    assert!(
        matches!(err, EspeakError::TextTooLong { len } if len == long.len()),
        "{err:?}"
    );
    for voice in ["", &"v".repeat(40), "en\0us"] {
        let err = espeak.phonemize(voice, "hi").unwrap_err();
        assert!(
            matches!(err, EspeakError::VoiceName(_)),
            "{voice:?}: {err:?}"
        );
    }
    // Text ends at a NUL, as espeak-ng reads it; nothing to say is no clause.
    assert_eq!(
        espeak.phonemize("en-us", "Hello\0, world").unwrap(),
        espeak.phonemize("en-us", "Hello").unwrap()
    );
    let nothing = espeak.phonemize("en-us", "").unwrap();
    assert!(nothing.iter().all(String::is_empty), "{nothing:?}");
}

#[test]
fn threads_take_turns_and_get_their_own_phonemes() {
    let Some(espeak) = load() else { return };
    let texts = [
        "Good morning.",
        "Set a timer for ten minutes.",
        "Gute Nacht.",
    ];
    let voices = ["en-us", "en-us", "de"];
    let expected: Vec<Vec<String>> = texts
        .iter()
        .zip(voices)
        .map(|(t, v)| espeak.phonemize(v, t).unwrap())
        .collect();
    std::thread::scope(|s| {
        for i in 0..6 {
            let espeak = &espeak;
            let expected = &expected;
            s.spawn(move || {
                for round in 0..20 {
                    let k = (i + round) % texts.len();
                    assert_eq!(espeak.phonemize(voices[k], texts[k]).unwrap(), expected[k]);
                }
            });
        }
    });
}
