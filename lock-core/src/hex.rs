//! Lowercase hex digits of raw bytes: the hash tag of a key's Redis names and the random part
//! of a token are both written this way.

/// Writes the digits of `bytes` into `out`, two per byte, high nibble first. `out` should be
/// twice as long as `bytes`; digits that do not fit are left out.
pub(crate) fn encode_into(bytes: &[u8], out: &mut [u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (pair, byte) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[usize::from(byte >> 4)];
        pair[1] = DIGITS[usize::from(byte & 0xf)];
    }
}
