//! The fuse module's `enable_uring` switch, for the tests of `--transport uring`.
//!
//! FUSE over io_uring is offered only while `/sys/module/fuse/parameters/enable_uring` is
//! Y (N by default). A test that needs it holds an [`EnableUring`]: the first holder in
//! this test process sets Y, the last one restores what was there. Tests of one binary run
//! in parallel threads, hence the count; test binaries run one at a time. Y changes
//! nothing for the `dev` transport (it only lets INIT offer the flag, which `dev` does not
//! ask for).

use std::sync::Mutex;

pub use fuse::mount::ENABLE_URING;

/// Holders, and the value to restore when the last one goes.
static STATE: Mutex<(usize, Option<String>)> = Mutex::new((0, None));

/// While alive, `enable_uring` is Y.
pub struct EnableUring(());

impl EnableUring {
    /// Sets Y (if this is the first holder), or says why it cannot: no such switch (a
    /// kernel without FUSE over io_uring) or no permission.
    pub fn acquire() -> Result<EnableUring, String> {
        let mut state = STATE.lock().unwrap_or_else(|e| e.into_inner());
        if state.0 == 0 {
            let before = std::fs::read_to_string(ENABLE_URING)
                .map_err(|e| format!("{ENABLE_URING}: {e} (kernel without FUSE over io_uring?)"))?;
            std::fs::write(ENABLE_URING, "Y")
                .map_err(|e| format!("setting {ENABLE_URING}: {e}"))?;
            state.1 = Some(before.trim().to_string());
        }
        state.0 += 1;
        Ok(EnableUring(()))
    }
}

impl Drop for EnableUring {
    fn drop(&mut self) {
        let mut state = STATE.lock().unwrap_or_else(|e| e.into_inner());
        state.0 -= 1;
        if state.0 == 0 {
            if let Some(before) = state.1.take() {
                let _ = std::fs::write(ENABLE_URING, before);
            }
        }
    }
}

/// Runs `f` with `enable_uring` set to `value`, then restores it; for a test that needs it
/// off. Must not overlap with holders of [`EnableUring`] in the same process.
pub fn with_enable_uring<T>(value: &str, f: impl FnOnce() -> T) -> Result<T, String> {
    let state = STATE.lock().unwrap_or_else(|e| e.into_inner());
    assert_eq!(state.0, 0, "with_enable_uring while EnableUring is held");
    let before =
        std::fs::read_to_string(ENABLE_URING).map_err(|e| format!("{ENABLE_URING}: {e}"))?;
    std::fs::write(ENABLE_URING, value).map_err(|e| format!("setting {ENABLE_URING}: {e}"))?;
    let result = f();
    let _ = std::fs::write(ENABLE_URING, before.trim());
    drop(state);
    Ok(result)
}
