//! Lowercase hex digits of raw bytes: the hash tag of a key's Redis names and the random part
//! of a token are both written this way.

/// The two digits of every byte value, high nibble first: one lookup and one two-byte copy
/// per byte (every acquire and release writes a token's sixteen).
const PAIRS: [[u8; 2]; 256] = {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut pairs = [[0u8; 2]; 256];
    let mut byte = 0;
    while byte < 256 {
        pairs[byte] = [DIGITS[byte >> 4], DIGITS[byte & 0xf]];
        byte += 1;
    }
    pairs
};

/// Writes the digits of `bytes` into `out`, two per byte, high nibble first. `out` should be
/// twice as long as `bytes`; digits that do not fit are left out.
pub(crate) fn encode_into(bytes: &[u8], out: &mut [u8]) {
    for (pair, byte) in out.chunks_exact_mut(2).zip(bytes) {
        pair.copy_from_slice(&PAIRS[usize::from(*byte)]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_as_two_lowercase_digits() {
        let bytes: Vec<u8> = (0..=255).collect();
        let mut out = vec![0u8; 512];
        encode_into(&bytes, &mut out);
        let expected: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(out, expected.as_bytes());
        // Digits that do not fit are left out.
        let mut short = [b'-'; 3];
        encode_into(&[0xab, 0xcd], &mut short);
        assert_eq!(&short, b"ab-");
    }
}
