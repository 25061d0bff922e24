//! [`in_box`]: a future built in the box it is polled from.
//!
//! `Box::pin(make())` builds the future on the stack and copies all of it into the box,
//! the bytes of states not yet entered included: for the acquire's future about 2 KB, for a
//! Redis call's or a release's about one. Written into the box as it is made, only what the
//! future starts with (its arguments) is copied. Used where a box sits on the uncontended
//! acquire's or release's path, which every lock passes once.

use std::pin::Pin;

/// The value `make` returns, written into a new box and pinned there.
pub(crate) fn in_box<F>(make: impl FnOnce() -> F) -> Pin<Box<F>> {
    let slot = Box::<F>::new_uninit();
    Box::into_pin(Box::write(slot, make()))
}
