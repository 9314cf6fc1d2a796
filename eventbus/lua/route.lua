-- L2 + L3: apply one stream entry of a job in seq order, then publish it; ACK it when done.
--
-- KEYS[1] applied seq key  {d:s}:applied-seq:<job_id>  (string: the job's last applied seq)
-- KEYS[2] router dedup key {d:s}:router:published:<job_id>:<seq>  (string)
-- KEYS[3] state key        {d:s}:state:<job_id>  (string)
-- KEYS[4] history key      {d:s}:history:<job_id>  (sorted set: score seq, member event JSON)
-- KEYS[5] stream key       {d:s}:events  (stream)
-- KEYS[6] channel          {d:s}:channel:<job_id>, the job's pub/sub channel (declared as a key:
--                          on a Redis Cluster it is a shard channel of the script's slot)
-- ARGV[1] seq
-- ARGV[2] prev_seq         the job's seq published just before this one (0 for the first)
-- ARGV[3] event JSON       published, stored in the history and (if newer) as the state
-- ARGV[4] publish command  SPUBLISH on a Redis Cluster (the shard's master alone carries the
--                          message), PUBLISH on a single server
-- ARGV[5] group            consumer group that holds the entry
-- ARGV[6] stream id        the entry, acked on applied or duplicate
-- ARGV[7] router dedup ttl seconds, also the applied seq key's
-- ARGV[8] state ttl        seconds
-- ARGV[9] history ttl      seconds
-- ARGV[10] history maxlen  entries kept (the newest)
--
-- Returns 1 applied, 0 duplicate (both acked), 2 deferred: the predecessor is not applied yet,
-- so nothing is written and the entry stays pending, to be retried. An error reply
-- "CORRUPT <key> ..." when a key holds the wrong type (or the applied seq key no seq): nothing
-- is written either, the entry stays pending, and the reclaimer retries it, then dead-letters it
-- with that reason.
--
-- Every check and read comes before the first write: Redis keeps what a script wrote before an
-- error, so an applied seq written before a failing ZADD would make the retry a "duplicate",
-- acked without ever being in the history or published.
-- wrong_type(key, expected): eventbus/lua/_prelude.lua, prepended when loaded.
local corrupt = wrong_type(KEYS[1], 'string') or wrong_type(KEYS[2], 'string')
  or wrong_type(KEYS[3], 'string') or wrong_type(KEYS[4], 'zset') or wrong_type(KEYS[5], 'stream')
if corrupt then
  return corrupt
end
local seq = tonumber(ARGV[1])
local raw_applied = redis.call('GET', KEYS[1])
local applied = tonumber(raw_applied or '0')
if not applied then
  return redis.error_reply(
    'CORRUPT ' .. KEYS[1] .. ' holds ' .. string.format('%q', raw_applied:sub(1, 40)) .. ', not a seq')
end
if seq <= applied or redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('XACK', KEYS[5], ARGV[5], ARGV[6])
  return 0
end
if tonumber(ARGV[2]) ~= applied then
  return 2
end
-- The publish script writes the state too, possibly ahead of us: never move it backwards.
local state = redis.call('GET', KEYS[3])
local state_seq = state and tonumber(string.match(state, '"seq":(%d+)')) or 0
-- Writes only from here on.
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[7])
if seq > state_seq then
  redis.call('SET', KEYS[3], ARGV[3], 'EX', ARGV[8])
end
redis.call('ZADD', KEYS[4], seq, ARGV[3])
if redis.call('ZCARD', KEYS[4]) > tonumber(ARGV[10]) then
  redis.call('ZREMRANGEBYRANK', KEYS[4], 0, -tonumber(ARGV[10]) - 1)
end
redis.call('EXPIRE', KEYS[4], ARGV[9])
redis.call(ARGV[4], KEYS[6], ARGV[3])
redis.call('SET', KEYS[2], 1, 'EX', ARGV[7])
redis.call('XACK', KEYS[5], ARGV[5], ARGV[6])
return 1
