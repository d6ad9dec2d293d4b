//! Key names and Redis Cluster slots: every key of one check shares one hash tag (the key's
//! bytes in braces), so that one call can hold them all, on a cluster too.

use std::io::Write as _;

/// Positions grouped by their slot, in the order the slots first appear.
pub(crate) fn by_slot(slots: impl Iterator<Item = u16>) -> Vec<Vec<usize>> {
    let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
    for (i, slot) in slots.enumerate() {
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, group)) => group.push(i),
            None => groups.push((slot, vec![i])),
        }
    }
    groups.into_iter().map(|(_, group)| group).collect()
}

/// A window counter's name: `<prefix><key length>:{k<key>}:<tier>:<window>`, the window being
/// its start over the period; the braces keep every counter of a key in one slot.
pub(crate) fn counter_key(prefix: &[u8], key: &[u8], tier: usize, window: u64) -> Vec<u8> {
    let mut name = tagged(prefix, key, 40);
    // Writing to a Vec cannot fail.
    let _ = write!(name, ":{tier}:{window}");
    name
}

/// `<prefix><key length>:{k<key>}`, the key's bytes its hash tag, with room for `more` bytes.
pub(super) fn tagged(prefix: &[u8], key: &[u8], more: usize) -> Vec<u8> {
    let mut name = Vec::with_capacity(prefix.len() + key.len() + 24 + more);
    name.extend_from_slice(prefix);
    name.extend_from_slice(itoa::Buffer::new().format(key.len()).as_bytes());
    name.extend_from_slice(b":{k");
    name.extend_from_slice(key);
    name.push(b'}');
    name
}

/// Redis Cluster's slot of a key name: CRC16 (XMODEM) of its hash tag, modulo 16384.
pub(crate) fn slot(name: &[u8]) -> u16 {
    let tag = name
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &name[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(name);
    let mut crc: u16 = 0;
    for &byte in tag {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16_384
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_computed_as_redis_does() {
        // Known values from the Redis Cluster specification and redis-cli CLUSTER KEYSLOT.
        assert_eq!(slot(b"123456789"), 0x31c3);
        assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
        assert_eq!(slot(b"foo"), 12_182);
    }
}
