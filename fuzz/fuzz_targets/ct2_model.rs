//! The CTranslate2 `model.bin` reader (a user-supplied local speech model) on arbitrary bytes:
//! never a panic or an allocation beyond the input; every variable it returns lies inside the
//! input and has exactly the bytes its shape and type call for.
#![no_main]

use libfuzzer_sys::fuzz_target;
use voxgate_local_speech::ct2;

fuzz_target!(|data: &[u8]| {
    let Ok(model) = ct2::parse(data) else {
        return;
    };
    let range = data.as_ptr_range();
    for (name, v) in &model.variables {
        assert!(!name.contains('\0'), "a name kept its terminator");
        let elements: usize = v.shape.iter().product();
        assert_eq!(elements * v.dtype.size(), v.data.len(), "{name}");
        if !v.data.is_empty() {
            let r = v.data.as_ptr_range();
            assert!(range.start <= r.start && r.end <= range.end, "{name} points outside");
        }
        let _ = v.scalar_i64();
    }
});
