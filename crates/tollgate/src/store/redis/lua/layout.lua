-- The layout of what the store, this library and tollgate's module exchange, written from
-- src/layout.rs (TOLLGATE_BLESS=1 cargo test -p tollgate --lib layout): do not edit.
-- A call's header: now (µs; -1 the server's TIME), cost, max_delay (µs; -1 none), ttl_padding (ms),
-- settle, credit_at (µs).
local HEADER_FORMAT = '<dddddd'
-- What a settlement does (the header's settle; else a credit).
local SETTLE_REPORT, SETTLE_RENEW = 1, 3
-- A tier's arguments: limit, period (µs), burst, per_permit, per_micro, state words, p1..p5.
local TIER_FORMAT, TIER_BYTES = '<ddddddddddd', 88
-- A tier's verdict: allowed (1/0), limit, remaining, reset_after (µs), retry_after (µs), delay (µs).
local VERDICT_DOUBLES = 6
-- The counters' items: an add's, a lease's, a claim's (see layout.rs, counters).
local ADD_FORMAT, LEASE_FORMAT, CLAIM_FORMAT = '<dd', '<dddddddd', '<ddddddddd'
-- The book's arguments: a record kept, a commit, expired records asked for.
local KEEP_FORMAT, COMMIT_FORMAT, EXPIRED_FORMAT = '<ddd', '<dd', '<dd'
-- Global rules (regions.lua): a check's modes, head, item, tier and answers; a sync's and
-- a merge's items and answers (see layout.rs, regions).
local REGIONS_LOOK, REGIONS_CHECK, REGIONS_REPORT, REGIONS_CREDIT, REGIONS_HEAD, REGIONS_ITEM, REGIONS_TIER, REGIONS_ITEM_ANSWER, REGIONS_TIER_ANSWER, REGIONS_SYNC, REGIONS_SYNC_PEER, REGIONS_SYNCED, REGIONS_MERGE, REGIONS_MERGED = 0, 1, 2, 3, 3, 5, 4, 2, 3, 1, 3, 2, 3, 3
-- A batch's description: what it does (BATCH_LOOK asks and writes nothing), then per item its
-- algorithm's index, cost, shadow (1/0) and number of keys.
local BATCH_LOOK, BATCH_FORMAT, ITEM_FORMAT = 1, '<d', '<dddd'
