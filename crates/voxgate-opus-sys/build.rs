//! Compiles libopus with the `cc` crate: a C compiler is all it needs (no cmake, no autotools).
//!
//! The sources are the libopus release that the `opusic-sys` crate ships in its package (its
//! `opus/` directory), found through `cargo metadata` so that cargo's own download, checksum,
//! vendoring and source replacement all apply; `VOXGATE_LIBOPUS_SRC` can name another libopus
//! source tree instead. The file lists come from libopus's own `*_sources.mk`, and the
//! configuration is the one its CMake build uses by default for a float build: hardening on,
//! C99 variable-length arrays, and on x86 the SSE, SSE2, SSE4.1 and AVX2 kernels chosen at run
//! time by CPUID (run-time CPU detection, RTCD).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The `opusic-sys` release whose package carries the libopus sources (libopus 1.6.1); keep in
/// step with the build-dependency in Cargo.toml.
const SOURCE_CRATE: &str = "opusic-sys";
const SOURCE_VERSION: &str = "0.7.7";

fn main() {
    if let Err(e) = build() {
        println!("cargo:warning=voxgate-opus-sys: {e}");
        eprintln!("error: voxgate-opus-sys: {e}");
        std::process::exit(1);
    }
}

fn build() -> Result<(), String> {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=VOXGATE_LIBOPUS_SRC");
    let root = match std::env::var_os("VOXGATE_LIBOPUS_SRC") {
        Some(dir) => PathBuf::from(dir),
        None => locate_sources()?,
    };
    if !root.join("include/opus.h").is_file() {
        return Err(format!("{} is not a libopus source tree", root.display()));
    }
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let features = std::env::var("CARGO_CFG_TARGET_FEATURE").unwrap_or_default();
    let has = |f: &str| features.split(',').any(|x| x == f);
    let x86 = arch == "x86" || arch == "x86_64";

    let mut base = cc::Build::new();
    base.include(root.join("include"))
        .include(&root)
        .include(root.join("celt"))
        .include(root.join("silk"))
        .include(root.join("silk/float"))
        .include(root.join("dnn"))
        .define("OPUS_BUILD", None)
        .define("ENABLE_HARDENING", None)
        .define("HAVE_LRINT", None)
        .define("HAVE_LRINTF", None)
        // libopus is far too slow unoptimised (as opus-rs is, see the workspace profile), and
        // its CMake build is Release whatever the Rust profile: so is this one.
        .opt_level(3)
        .debug(false)
        .define("NDEBUG", None)
        .warnings(false);
    // The release's `package_version` file (`PACKAGE_VERSION="1.6.1"`), which libopus's own
    // builds turn into the version `opus_get_version_string` reports.
    if let Ok(text) = std::fs::read_to_string(root.join("package_version"))
        && let Some(v) = text.trim().strip_prefix("PACKAGE_VERSION=")
    {
        base.define("PACKAGE_VERSION", v);
    }
    let msvc = base.get_compiler().is_like_msvc();
    if msvc {
        base.define("USE_ALLOCA", None);
    } else {
        base.define("VAR_ARRAYS", None)
            .define("_FORTIFY_SOURCE", "2")
            .flag("-fstack-protector-strong");
    }
    let mut simd: Vec<(&str, &[&str])> = Vec::new();
    if x86 {
        // Baseline features of the target (x86_64 always has SSE and SSE2) are presumed; the
        // rest are compiled in and picked per machine at encoder/decoder creation.
        base.define("OPUS_HAVE_RTCD", None)
            .define("OPUS_X86_MAY_HAVE_SSE", None)
            .define("OPUS_X86_MAY_HAVE_SSE2", None)
            .define("OPUS_X86_MAY_HAVE_SSE4_1", None)
            .define("OPUS_X86_MAY_HAVE_AVX2", None);
        if !msvc {
            base.define("CPU_INFO_BY_C", None);
        }
        if has("sse") {
            base.define("OPUS_X86_PRESUME_SSE", None);
        }
        if has("sse2") {
            base.define("OPUS_X86_PRESUME_SSE2", None);
        }
        if has("sse4.1") {
            base.define("OPUS_X86_PRESUME_SSE4_1", None);
        }
        if has("avx2") && has("fma") {
            base.define("OPUS_X86_PRESUME_AVX2", None);
        }
        let avx2: &[&str] = if msvc {
            &["/arch:AVX2"]
        } else {
            &["-mavx", "-mfma", "-mavx2"]
        };
        simd = vec![
            ("CELT_SOURCES_SSE", if msvc { &[] } else { &["-msse"] }),
            ("CELT_SOURCES_SSE2", if msvc { &[] } else { &["-msse2"] }),
            (
                "CELT_SOURCES_SSE4_1",
                if msvc { &[] } else { &["-msse4.1"] },
            ),
            (
                "SILK_SOURCES_SSE4_1",
                if msvc { &[] } else { &["-msse4.1"] },
            ),
            ("CELT_SOURCES_AVX2", avx2),
            ("SILK_SOURCES_AVX2", avx2),
            ("SILK_SOURCES_FLOAT_AVX2", avx2),
        ];
    }

    let mut lists = vec![
        "CELT_SOURCES",
        "SILK_SOURCES",
        "SILK_SOURCES_FLOAT",
        "OPUS_SOURCES",
        "OPUS_SOURCES_FLOAT",
    ];
    if x86 {
        lists.extend(["CELT_SOURCES_X86_RTCD", "SILK_SOURCES_X86_RTCD"]);
    }
    let mk = read_source_lists(&root)?;
    let files = |name: &str| -> Result<Vec<PathBuf>, String> {
        let list = mk
            .iter()
            .find(|(n, _)| n == name)
            .ok_or_else(|| format!("{name} not found in libopus's *_sources.mk"))?;
        Ok(list.1.iter().map(|f| root.join(f)).collect())
    };

    // Each instruction-set group gets its own flags, so those objects are built apart and then
    // archived with the rest into one libopus.a.
    let mut objects = Vec::new();
    for (name, flags) in simd {
        let mut b = base.clone();
        for f in flags {
            b.flag(f);
        }
        b.files(files(name)?);
        objects.extend(
            b.try_compile_intermediates()
                .map_err(|e| format!("compiling {name}: {e}"))?,
        );
    }
    let mut lib = base.clone();
    for name in lists {
        let mut list = files(name)?;
        if x86 {
            // Built apart below, under another name, behind a cache.
            list.retain(|f| !f.ends_with(X86_CPU_DETECTION));
        }
        lib.files(list);
    }
    if x86 {
        objects.extend(cached_arch_detection(&base, &root)?);
    }
    lib.objects(objects);
    lib.try_compile("opus")
        .map_err(|e| format!("compiling libopus: {e}"))?;
    println!("cargo:include={}", root.join("include").display());
    Ok(())
}

/// libopus's x86 run-time CPU detection: `opus_select_arch`, which runs CPUID.
const X86_CPU_DETECTION: &str = "celt/x86/x86cpu.c";

/// `opus_select_arch` with its answer cached. libopus asks it again for every encoder and
/// decoder it initialises or resets (twice per decoder, three times per encoder), and CPUID
/// is an instruction a virtual machine traps to its hypervisor: on this project's VMs the
/// detection was 3 % of the server's CPU at 500 Xiaozhi sessions, whose uplink decoders and
/// reply encoders live one utterance or one reply each. The CPU does not change while the
/// process runs, so the first answer serves every later call. The file is compiled with its
/// function renamed, and a small C file defines `opus_select_arch` over it.
fn cached_arch_detection(base: &cc::Build, root: &Path) -> Result<Vec<PathBuf>, String> {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").ok_or("OUT_DIR is not set")?);
    let shim = out.join("voxgate_select_arch.c");
    std::fs::write(&shim, SELECT_ARCH_SHIM).map_err(|e| format!("{}: {e}", shim.display()))?;
    let mut renamed = base.clone();
    renamed
        .define("opus_select_arch", "voxgate_opus_select_arch_uncached")
        .file(root.join(X86_CPU_DETECTION));
    let mut objects = renamed
        .try_compile_intermediates()
        .map_err(|e| format!("compiling {X86_CPU_DETECTION}: {e}"))?;
    objects.extend(
        base.clone()
            .file(&shim)
            .try_compile_intermediates()
            .map_err(|e| format!("compiling the arch cache: {e}"))?,
    );
    Ok(objects)
}

/// The cache: a relaxed atomic int (every thread computes the same value, so a race only
/// repeats the detection). Compilers without the GNU atomics call through uncached.
const SELECT_ARCH_SHIM: &str = r"/* Generated by voxgate-opus-sys/build.rs: opus_select_arch, cached. */
int voxgate_opus_select_arch_uncached(void);

int opus_select_arch(void)
{
#if defined(__GNUC__) || defined(__clang__)
    static int cached = -1;
    int arch = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (arch < 0) {
        arch = voxgate_opus_select_arch_uncached();
        __atomic_store_n(&cached, arch, __ATOMIC_RELAXED);
    }
    return arch;
#else
    return voxgate_opus_select_arch_uncached();
#endif
}
";

/// Every `NAME = a.c b.c ...` list (with `\` continuations) in libopus's `*_sources.mk`.
fn read_source_lists(root: &Path) -> Result<Vec<(String, Vec<String>)>, String> {
    let mut lists = Vec::new();
    for mk in ["celt_sources.mk", "silk_sources.mk", "opus_sources.mk"] {
        let path = root.join(mk);
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let joined = text.replace("\\\r\n", " ").replace("\\\n", " ");
        for line in joined.lines() {
            if let Some((name, rest)) = line.split_once('=') {
                let files = rest
                    .split_whitespace()
                    .filter(|f| f.ends_with(".c"))
                    .map(str::to_owned)
                    .collect();
                lists.push((name.trim().to_owned(), files));
            }
        }
    }
    Ok(lists)
}

/// The `opus/` directory of the `opusic-sys` package cargo downloaded for this build.
///
/// A one-dependency probe manifest in OUT_DIR asks `cargo metadata --offline` where that
/// package lives: offline, because the build-dependency is already downloaded; run from this
/// crate's directory, so the project's `.cargo/config.toml` (e.g. vendored sources) applies.
fn locate_sources() -> Result<PathBuf, String> {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").ok_or("OUT_DIR is not set")?);
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR").ok_or("CARGO_MANIFEST_DIR unset")?;
    let probe = out.join("locate-libopus");
    std::fs::create_dir_all(&probe).map_err(|e| format!("{}: {e}", probe.display()))?;
    let manifest = format!(
        "[package]\nname = \"locate-libopus\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\
         [lib]\npath = \"lib.rs\"\n\
         [dependencies]\n{SOURCE_CRATE} = {{ version = \"={SOURCE_VERSION}\", default-features = false }}\n\
         [workspace]\n"
    );
    let write = |name: &str, text: &str| {
        std::fs::write(probe.join(name), text).map_err(|e| format!("{name}: {e}"))
    };
    write("Cargo.toml", &manifest)?;
    write("lib.rs", "")?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .current_dir(manifest_dir)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--offline",
            "--manifest-path",
        ])
        .arg(probe.join("Cargo.toml"))
        .output()
        .map_err(|e| format!("running cargo metadata: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "cargo metadata could not locate {SOURCE_CRATE} {SOURCE_VERSION} (set VOXGATE_LIBOPUS_SRC \
             to a libopus source tree instead): {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let json: serde_json::Value = serde_json::from_slice(&output.stdout)
        .map_err(|e| format!("parsing cargo metadata: {e}"))?;
    let manifest_path = json["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == SOURCE_CRATE && p["version"] == SOURCE_VERSION)
        .and_then(|p| p["manifest_path"].as_str())
        .ok_or_else(|| format!("{SOURCE_CRATE} {SOURCE_VERSION} missing from cargo metadata"))?;
    let dir = Path::new(manifest_path)
        .parent()
        .ok_or("manifest path without parent")?;
    Ok(dir.join("opus"))
}
