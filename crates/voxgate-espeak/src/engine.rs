//! The process's one espeak-ng: the opened library, its functions, and the callbacks that
//! collect each clause's phonemes, behind one lock.
//!
//! espeak-ng is driven the way the `espeak-ng` program drives it for `-q --ipa -v <voice>
//! --stdin` (src/espeak-ng.c): `espeak_ng_InitializePath`, `espeak_ng_Initialize`,
//! `espeak_ng_InitializeOutput` in synchronous mode (no sound device), the voice by name or
//! else by language, `espeak_SetPhonemeTrace` with IPA, then `espeak_ng_Synthesize` with the
//! program's flags. Where the program prints each clause's phonemes to its trace stream,
//! espeak-ng also hands the same string to the phoneme callback, which collects it here; the
//! trace itself goes to `/dev/null`, and the audio to a callback that drops it.

use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char, c_int, c_short, c_void};
use std::os::unix::ffi::OsStrExt as _;
use std::path::PathBuf;
use std::ptr;
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use libloading::Library;

use crate::{Espeak, EspeakError, MAX_PHONEME_BYTES, TIME_LIMIT};

/// Values and function types of espeak-ng's public headers `speak_lib.h` and `espeak_ng.h`, as
/// in espeak-ng 1.52.0 (unchanged since 1.49.0, which added the `espeak_ng_*` functions).
mod c {
    use std::ffi::{c_char, c_int, c_short, c_uchar, c_uint, c_void};

    /// `ENS_OK` of `espeak_ng_STATUS` (espeak_ng.h).
    pub(super) const ENS_OK: c_int = 0;
    /// `ENOUTPUT_MODE_SYNCHRONOUS` (0x0001) of `espeak_ng_OUTPUT_MODE` (espeak_ng.h), without
    /// `ENOUTPUT_MODE_SPEAK_AUDIO`: synthesis runs in the calling thread and hands its audio to
    /// the synth callback, never to a sound device (the program's mode for `-q`).
    pub(super) const OUTPUT_SYNCHRONOUS: c_int = 0x0001;
    /// `espeakPHONEMES_IPA` (0x02, speak_lib.h), the phoneme mode `espeak-ng --ipa` sets.
    pub(super) const PHONEMES_IPA: c_int = 0x02;
    /// `POS_CHARACTER` (1) of `espeak_POSITION_TYPE` (speak_lib.h).
    pub(super) const POS_CHARACTER: c_int = 1;
    /// `espeakCHARS_AUTO` (0) | `espeakPHONEMES` (0x100) | `espeakENDPAUSE` (0x1000), all of
    /// speak_lib.h: the program's `synth_flags`, so the text is read as the program reads it.
    pub(super) const SYNTH_FLAGS: c_uint = 0x100 | 0x1000;
    /// Room for `espeak_ng_GetStatusCodeMessage`'s longest message with its path.
    pub(super) const MESSAGE_BYTES: usize = 512;

    /// `espeak_VOICE` (speak_lib.h): the selector `espeak_ng_SetVoiceByProperties` takes.
    #[repr(C)]
    pub(super) struct Voice {
        pub(super) name: *const c_char,
        pub(super) languages: *const c_char,
        pub(super) identifier: *const c_char,
        pub(super) gender: c_uchar,
        pub(super) age: c_uchar,
        pub(super) variant: c_uchar,
        pub(super) xx1: c_uchar,
        pub(super) score: c_int,
        pub(super) spare: *mut c_void,
    }

    /// `void espeak_ng_InitializePath(const char *path)`.
    pub(super) type InitializePath = unsafe extern "C" fn(*const c_char);
    /// `espeak_ng_STATUS espeak_ng_Initialize(espeak_ng_ERROR_CONTEXT *context)`; the context
    /// is a pointer to an opaque struct.
    pub(super) type Initialize = unsafe extern "C" fn(*mut *mut c_void) -> c_int;
    /// `void espeak_ng_ClearErrorContext(espeak_ng_ERROR_CONTEXT *context)`.
    pub(super) type ClearErrorContext = unsafe extern "C" fn(*mut *mut c_void);
    /// `espeak_ng_STATUS espeak_ng_InitializeOutput(espeak_ng_OUTPUT_MODE, int buffer_length,
    /// const char *device)`.
    pub(super) type InitializeOutput = unsafe extern "C" fn(c_int, c_int, *const c_char) -> c_int;
    /// `void espeak_ng_GetStatusCodeMessage(espeak_ng_STATUS, char *buffer, size_t length)`.
    pub(super) type GetStatusCodeMessage = unsafe extern "C" fn(c_int, *mut c_char, usize);
    /// `espeak_ng_STATUS espeak_ng_SetVoiceByName(const char *name)`.
    pub(super) type SetVoiceByName = unsafe extern "C" fn(*const c_char) -> c_int;
    /// `espeak_ng_STATUS espeak_ng_SetVoiceByProperties(espeak_VOICE *voice_selector)`.
    pub(super) type SetVoiceByProperties = unsafe extern "C" fn(*mut Voice) -> c_int;
    /// `espeak_ng_STATUS espeak_ng_Synthesize(const void *text, size_t size, unsigned int
    /// position, espeak_POSITION_TYPE, unsigned int end_position, unsigned int flags, unsigned
    /// int *unique_identifier, void *user_data)`.
    pub(super) type Synthesize = unsafe extern "C" fn(
        *const c_void,
        usize,
        c_uint,
        c_int,
        c_uint,
        c_uint,
        *mut c_uint,
        *mut c_void,
    ) -> c_int;
    /// `t_espeak_callback`: `int SynthCallback(short *wav, int numsamples, espeak_EVENT
    /// *events)`; a non-zero return stops the synthesis.
    pub(super) type SynthCallback = unsafe extern "C" fn(*mut c_short, c_int, *mut c_void) -> c_int;
    /// `void espeak_SetSynthCallback(t_espeak_callback *SynthCallback)`.
    pub(super) type SetSynthCallback = unsafe extern "C" fn(Option<SynthCallback>);
    /// `int (*PhonemeCallback)(const char *)`, called with each clause's phonemes.
    pub(super) type PhonemeCallback = unsafe extern "C" fn(*const c_char) -> c_int;
    /// `void espeak_SetPhonemeCallback(int (*PhonemeCallback)(const char *))`.
    pub(super) type SetPhonemeCallback = unsafe extern "C" fn(Option<PhonemeCallback>);
    /// `void espeak_SetPhonemeTrace(int phonememode, FILE *stream)`; a NULL stream means
    /// stderr.
    pub(super) type SetPhonemeTrace = unsafe extern "C" fn(c_int, *mut libc::FILE);
    /// `const char *espeak_Info(const char **path_data)`: the version string.
    pub(super) type Info = unsafe extern "C" fn(*mut *const c_char) -> *const c_char;
}

/// The functions called, resolved from the library once. Plain function pointers: they stay
/// valid as long as the library is loaded, which is for good (see [`Slot`]).
struct Api {
    initialize_path: c::InitializePath,
    initialize: c::Initialize,
    clear_error_context: c::ClearErrorContext,
    initialize_output: c::InitializeOutput,
    status_message: c::GetStatusCodeMessage,
    set_voice_by_name: c::SetVoiceByName,
    set_voice_by_properties: c::SetVoiceByProperties,
    synthesize: c::Synthesize,
    set_synth_callback: c::SetSynthCallback,
    set_phoneme_callback: c::SetPhonemeCallback,
    set_phoneme_trace: c::SetPhonemeTrace,
    info: c::Info,
}

impl Api {
    fn resolve(library: &Library, path: &std::path::Path) -> Result<Self, EspeakError> {
        /// One function of `library` as the type `T` the header gives it.
        fn get<T: Copy>(
            library: &Library,
            path: &std::path::Path,
            symbol: &'static str,
        ) -> Result<T, EspeakError> {
            // SAFETY: every `T` asked for below is the C signature espeak-ng's public header
            // declares for that symbol (module `c`), and libespeak-ng exports the symbol with
            // it; the pointer copied out is used only while the library stays loaded (for good).
            unsafe { library.get::<T>(symbol) }
                .map(|s| *s)
                .map_err(|_| EspeakError::Symbol {
                    library: path.to_path_buf(),
                    symbol,
                })
        }
        Ok(Self {
            initialize_path: get(library, path, "espeak_ng_InitializePath")?,
            initialize: get(library, path, "espeak_ng_Initialize")?,
            clear_error_context: get(library, path, "espeak_ng_ClearErrorContext")?,
            initialize_output: get(library, path, "espeak_ng_InitializeOutput")?,
            status_message: get(library, path, "espeak_ng_GetStatusCodeMessage")?,
            set_voice_by_name: get(library, path, "espeak_ng_SetVoiceByName")?,
            set_voice_by_properties: get(library, path, "espeak_ng_SetVoiceByProperties")?,
            synthesize: get(library, path, "espeak_ng_Synthesize")?,
            set_synth_callback: get(library, path, "espeak_SetSynthCallback")?,
            set_phoneme_callback: get(library, path, "espeak_SetPhonemeCallback")?,
            set_phoneme_trace: get(library, path, "espeak_SetPhonemeTrace")?,
            info: get(library, path, "espeak_Info")?,
        })
    }

    /// espeak-ng's message for a status code.
    fn message(&self, status: c_int) -> String {
        let mut buffer = [0 as c_char; c::MESSAGE_BYTES];
        // SAFETY: espeak-ng writes at most `length` bytes, NUL included (strncpy0 / snprintf),
        // into the buffer, which is that long; the last byte is then forced to NUL anyway.
        unsafe { (self.status_message)(status, buffer.as_mut_ptr(), buffer.len()) };
        buffer[c::MESSAGE_BYTES - 1] = 0;
        // SAFETY: the buffer is NUL-terminated (above) and lives through the call.
        let text = unsafe { CStr::from_ptr(buffer.as_ptr()) };
        format!("{} (status {status:#x})", text.to_string_lossy())
    }
}

/// The started espeak-ng.
struct Engine {
    handle: Espeak,
    api: Api,
    /// The voice selected last, to select it again only when another one is asked for.
    voice: Option<String>,
    /// Kept so the library is never unloaded: [`Api`]'s pointers and the callbacks espeak-ng
    /// holds stay valid.
    _library: Library,
}

/// The process's espeak-ng: not yet loaded, started, or failed to start (then its half-set
/// global state is never used again, and the library stays loaded).
enum Slot {
    Empty,
    Ready(Engine),
    Failed { reason: String, _library: Library },
}

static SLOT: Mutex<Slot> = Mutex::new(Slot::Empty);

/// The slot, locked. Nothing panics while it is held, so a poisoned lock is still consistent.
fn slot() -> std::sync::MutexGuard<'static, Slot> {
    SLOT.lock().unwrap_or_else(PoisonError::into_inner)
}

fn data_name(data: Option<&PathBuf>) -> String {
    data.map_or_else(
        || "espeak-ng's default".to_owned(),
        |d| d.display().to_string(),
    )
}

pub(crate) fn load(library: PathBuf, data: Option<PathBuf>) -> Result<Espeak, EspeakError> {
    let mut slot = slot();
    match &*slot {
        Slot::Ready(engine) => {
            let h = &engine.handle;
            if h.library == library && h.data == data {
                return Ok(h.clone());
            }
            return Err(EspeakError::AlreadyLoaded {
                loaded: h.library.clone(),
                loaded_data: data_name(h.data.as_ref()),
                wanted: library,
            });
        }
        Slot::Failed { reason, .. } => return Err(EspeakError::Broken(reason.clone())),
        Slot::Empty => {}
    }
    // SAFETY: opening a shared library runs its initialisers; libespeak-ng's only set up
    // static data. It is never unloaded (kept in the slot), so no finaliser runs while its
    // functions or our callbacks may still be called.
    let opened = unsafe { Library::new(library.as_os_str()) }.map_err(|e| EspeakError::Load {
        library: library.clone(),
        reason: e.to_string(),
    })?;
    let api = Api::resolve(&opened, &library)?;
    let data_c = data
        .as_ref()
        .map(|d| CString::new(d.as_os_str().as_bytes()))
        .transpose()
        .map_err(|_| EspeakError::Data {
            data: data.clone().unwrap_or_default(),
            reason: "its path holds a NUL byte".into(),
        })?;
    // SAFETY: both arguments are NUL-terminated literals.
    let trace = unsafe { libc::fopen(c"/dev/null".as_ptr(), c"w".as_ptr()) };
    if trace.is_null() {
        return Err(EspeakError::Init {
            library,
            message: format!(
                "cannot open /dev/null for its phoneme trace: {}",
                std::io::Error::last_os_error()
            ),
        });
    }
    // From here on espeak-ng's globals change: a failure is final for this process.
    let started = start(&api, data_c.as_deref(), trace);
    let version = match started {
        Ok(version) => version,
        Err(message) => {
            // SAFETY: `trace` was opened above and espeak-ng was not given it.
            unsafe { libc::fclose(trace) };
            let reason = format!("{}: {message}", library.display());
            *slot = Slot::Failed {
                reason,
                _library: opened,
            };
            return Err(EspeakError::Init { library, message });
        }
    };
    let handle = Espeak {
        library,
        data,
        version,
    };
    *slot = Slot::Ready(Engine {
        handle: handle.clone(),
        api,
        voice: None,
        _library: opened,
    });
    Ok(handle)
}

/// Starts espeak-ng as the program does, with the callbacks and the trace stream set; its
/// version, or espeak-ng's message.
fn start(api: &Api, data: Option<&CStr>, trace: *mut libc::FILE) -> Result<String, String> {
    let data_ptr = data.map_or(ptr::null(), CStr::as_ptr);
    // SAFETY: `data_ptr` is NULL (espeak-ng's default place) or a NUL-terminated path that
    // outlives the call; espeak-ng copies it into its own buffer, and the caller checked that
    // it fits (MAX_DATA_PATH_BYTES).
    unsafe { (api.initialize_path)(data_ptr) };
    let mut context: *mut c_void = ptr::null_mut();
    // SAFETY: `context` is a valid place for espeak-ng to store an error context pointer.
    let status = unsafe { (api.initialize)(&raw mut context) };
    if status != c::ENS_OK {
        let message = api.message(status);
        // SAFETY: `context` is NULL or the context espeak-ng allocated just above; this frees
        // it and sets it to NULL.
        unsafe { (api.clear_error_context)(&raw mut context) };
        return Err(message);
    }
    // SAFETY: synchronous output needs no device (NULL); 0 asks for the default buffer.
    let status = unsafe { (api.initialize_output)(c::OUTPUT_SYNCHRONOUS, 0, ptr::null()) };
    if status != c::ENS_OK {
        return Err(api.message(status));
    }
    // SAFETY: the callbacks are `extern "C"` functions of this module with the C signatures
    // espeak-ng calls them with, valid for the life of the process; they never unwind.
    // `trace` is an open stream espeak-ng writes each clause to, never closed.
    unsafe {
        (api.set_synth_callback)(Some(on_audio));
        (api.set_phoneme_callback)(Some(on_phonemes));
        (api.set_phoneme_trace)(c::PHONEMES_IPA, trace);
    }
    // SAFETY: a NULL `path_data` is allowed (espeak-ng then does not report its data path);
    // the version string is static in the library.
    let version = unsafe { (api.info)(ptr::null_mut()) };
    if version.is_null() {
        return Ok("unknown".into());
    }
    // SAFETY: non-NULL, a NUL-terminated static string of the library.
    Ok(unsafe { CStr::from_ptr(version) }
        .to_string_lossy()
        .into_owned())
}

/// What one call collects from the callbacks, on the calling thread: espeak-ng runs the
/// synthesis synchronously in the thread that asked for it, which holds the lock throughout.
struct Collector {
    clauses: Vec<String>,
    bytes: usize,
    overflow: bool,
    deadline: Option<Instant>,
    timed_out: bool,
}

thread_local! {
    static COLLECTOR: RefCell<Collector> = const {
        RefCell::new(Collector {
            clauses: Vec::new(),
            bytes: 0,
            overflow: false,
            deadline: None,
            timed_out: false,
        })
    };
}

/// Called by espeak-ng with each clause's phonemes (the string the program prints as a line).
/// Never unwinds: every step that could fail is skipped instead.
unsafe extern "C" fn on_phonemes(phonemes: *const c_char) -> c_int {
    if phonemes.is_null() {
        return 0;
    }
    // SAFETY: espeak-ng passes a NUL-terminated string that is valid during the call.
    let bytes = unsafe { CStr::from_ptr(phonemes) }.to_bytes();
    let _ = COLLECTOR.try_with(|c| {
        if let Ok(mut c) = c.try_borrow_mut() {
            if c.bytes + bytes.len() > MAX_PHONEME_BYTES {
                c.overflow = true;
            } else {
                c.bytes += bytes.len();
                c.clauses.push(String::from_utf8_lossy(bytes).into_owned());
            }
        }
    });
    0
}

/// Called by espeak-ng with each block of audio, which is dropped; stops the synthesis
/// (non-zero) once the phonemes overflow or the time is up.
unsafe extern "C" fn on_audio(_wav: *mut c_short, _samples: c_int, _events: *mut c_void) -> c_int {
    COLLECTOR
        .try_with(|c| {
            c.try_borrow_mut().map_or(0, |mut c| {
                if c.deadline.is_some_and(|d| Instant::now() >= d) {
                    c.timed_out = true;
                }
                c_int::from(c.overflow || c.timed_out)
            })
        })
        .unwrap_or(0)
}

pub(crate) fn phonemize(voice: &str, text: &str) -> Result<Vec<String>, EspeakError> {
    let voice_c = CString::new(voice).map_err(|_| EspeakError::VoiceName(voice.to_owned()))?;
    let text_c = CString::new(text).map_err(|_| EspeakError::Synthesis("NUL in text".into()))?;
    let mut slot = slot();
    let engine = match &mut *slot {
        Slot::Ready(engine) => engine,
        Slot::Failed { reason, .. } => return Err(EspeakError::Broken(reason.clone())),
        // A handle exists only once the slot is ready, and it never goes back.
        Slot::Empty => return Err(EspeakError::Broken("espeak-ng is not loaded".into())),
    };
    if engine.voice.as_deref() != Some(voice) {
        engine.voice = None;
        select_voice(&engine.api, &voice_c).map_err(|message| EspeakError::Voice {
            voice: voice.to_owned(),
            message,
        })?;
        engine.voice = Some(voice.to_owned());
    }
    let _ = COLLECTOR.try_with(|c| {
        if let Ok(mut c) = c.try_borrow_mut() {
            c.clauses.clear();
            c.bytes = 0;
            c.overflow = false;
            c.timed_out = false;
            c.deadline = Some(Instant::now() + TIME_LIMIT);
        }
    });
    let bytes = text_c.as_bytes_with_nul().len();
    // SAFETY: the text is NUL-terminated and outlives the call (synchronous mode returns once
    // the whole text is done); `size` is its length with the NUL, as the program passes it;
    // no identifier or user data is asked for. The callbacks run on this thread during the
    // call, and the lock keeps every other thread out of espeak-ng meanwhile.
    let status = unsafe {
        (engine.api.synthesize)(
            text_c.as_ptr().cast(),
            bytes,
            0,
            c::POS_CHARACTER,
            0,
            c::SYNTH_FLAGS,
            ptr::null_mut(),
            ptr::null_mut(),
        )
    };
    let collected = COLLECTOR
        .try_with(|c| {
            c.try_borrow_mut().ok().map(|mut c| {
                c.deadline = None;
                (std::mem::take(&mut c.clauses), c.overflow, c.timed_out)
            })
        })
        .ok()
        .flatten();
    let Some((clauses, overflow, timed_out)) = collected else {
        return Err(EspeakError::Synthesis("the phonemes were lost".into()));
    };
    if overflow {
        return Err(EspeakError::OutputTooLong);
    }
    if timed_out {
        return Err(EspeakError::TimedOut(TIME_LIMIT));
    }
    if status != c::ENS_OK {
        return Err(EspeakError::Synthesis(engine.api.message(status)));
    }
    Ok(clauses)
}

/// Selects the voice as the program does for `-v`: by name, else as a language.
fn select_voice(api: &Api, voice: &CStr) -> Result<(), String> {
    // SAFETY: a NUL-terminated name that outlives the call; espeak-ng copies what it keeps.
    let status = unsafe { (api.set_voice_by_name)(voice.as_ptr()) };
    if status == c::ENS_OK {
        return Ok(());
    }
    let mut selector = c::Voice {
        name: ptr::null(),
        languages: voice.as_ptr(),
        identifier: ptr::null(),
        gender: 0,
        age: 0,
        variant: 0,
        xx1: 0,
        score: 0,
        spare: ptr::null_mut(),
    };
    // SAFETY: a zeroed `espeak_VOICE` with only `languages` set, to a NUL-terminated string
    // that outlives the call, as the program builds it; espeak-ng reads it during the call.
    let status = unsafe { (api.set_voice_by_properties)(&raw mut selector) };
    if status == c::ENS_OK {
        Ok(())
    } else {
        Err(api.message(status))
    }
}
