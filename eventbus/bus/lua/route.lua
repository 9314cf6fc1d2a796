-- L2 + L3: apply stream entries of one shard in seq order per job, publish each, ACK them.
--
-- One call settles a run of entries of one shard stream, in their order (the router's batch of
-- that stream, cut into calls of eventbus.bus.delivery.ROUTE_CALL_SIZE): every key is in the shard's
-- slot, and one call spares Redis a script call and an XACK per event.
--
-- KEYS[1]          stream key  {d:s}:events  (stream)
-- then 5 keys per entry i (0-based), from KEYS[2 + 5i]:
--   applied seq key  {d:s}:applied-seq:<job_id>  (string: the job's last applied seq)
--   router dedup key {d:s}:router:published:<job_id>:<seq>  (string)
--   state key        {d:s}:state:<job_id>  (string)
--   history key      {d:s}:history:<job_id>  (sorted set: score seq, member event JSON)
--   channel          {d:s}:channel:<job_id>, the job's pub/sub channel (declared as a key: on a
--                    Redis Cluster it is a shard channel of the script's slot)
-- ARGV[1] publish command  SPUBLISH on a Redis Cluster (the shard's master alone carries the
--                          message), PUBLISH on a single server
-- ARGV[2] group            consumer group that holds the entries
-- ARGV[3] router dedup ttl seconds, also the applied seq key's
-- ARGV[4] state ttl        seconds
-- ARGV[5] history ttl      seconds
-- ARGV[6] history maxlen   entries kept (the newest)
-- then 4 arguments per entry i, from ARGV[7 + 4i]: seq, prev_seq (the job's seq published just
-- before this one, 0 for the first), event JSON (published, stored in the history and, if
-- newer, as the state), stream id. A router that traces (exactly_once.tracing) gives every entry
-- of the call a fifth, from ARGV[7 + 5i]: a W3C traceparent, or "" for none. The channel's copy
-- of an entry with one ends with the member "tp" (the gateway strips it from the frame); its
-- history and state never hold it. The arguments' count tells which: (#ARGV - 6) per entry.
--
-- Returns one reply per entry: 1 applied, 0 duplicate (both acked, by one XACK at the end), 2
-- deferred: the predecessor is not applied yet, so nothing is written and the entry stays
-- pending, to be retried. An error reply "CORRUPT <key> ..." in an entry's place when one of its
-- keys holds the wrong type (or the applied seq key no seq): nothing of that entry is written,
-- it stays pending, and the reclaimer retries it, then dead-letters it with that reason; the
-- other entries are settled. A corrupt stream key fails the whole call, which writes nothing.
--
-- Every check and read of an entry comes before its first write: Redis keeps what a script
-- wrote before an error, so an applied seq written before a failing ZADD would make the retry a
-- "duplicate", acked without ever being in the history or published. The reads that check a
-- type are the ones the entry needs anyway (GET, ZCARD by pcall); TYPE names the wrong type.
-- wrong_type(key, expected): eventbus/bus/lua/_prelude.lua, prepended when loaded.
local corrupt_stream = wrong_type(KEYS[1], 'stream')
if corrupt_stream then
  return corrupt_stream
end
local publish, dedup_ttl, state_ttl = ARGV[1], ARGV[3], ARGV[4]
local history_ttl, maxlen = ARGV[5], tonumber(ARGV[6])
local entries = (#KEYS - 1) / 5
local per_entry = (#ARGV - 6) / entries

local function failed(reply)
  return type(reply) == 'table' and reply['err'] ~= nil
end

-- The reply of one entry, and whether it is to be acked.
local function route(k, a)
  local applied_key, dedup_key, state_key, history_key = KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]
  local seq = tonumber(ARGV[a])
  local raw_applied = redis.pcall('GET', applied_key)
  if failed(raw_applied) then
    return wrong_type(applied_key, 'string') or raw_applied, false
  end
  local applied = tonumber(raw_applied or '0')
  if not applied then
    return redis.error_reply(
      'CORRUPT ' .. applied_key .. ' holds ' .. string.format('%q', raw_applied:sub(1, 40)) .. ', not a seq'), false
  end
  local dedup = redis.call('TYPE', dedup_key)['ok']
  if dedup ~= 'none' and dedup ~= 'string' then
    return wrong_type(dedup_key, 'string'), false
  end
  if seq <= applied or dedup == 'string' then
    return 0, true
  end
  if tonumber(ARGV[a + 1]) ~= applied then
    return 2, false
  end
  -- The publish script writes the state too, possibly ahead of us: never move it backwards.
  local state = redis.pcall('GET', state_key)
  if failed(state) then
    return wrong_type(state_key, 'string') or state, false
  end
  local size = redis.pcall('ZCARD', history_key)
  if failed(size) then
    return wrong_type(history_key, 'zset') or size, false
  end
  local state_seq = state and tonumber(string.match(state, '"seq":(%d+)')) or 0
  local event = ARGV[a + 2]
  -- Writes only from here on.
  redis.call('SET', applied_key, ARGV[a], 'EX', dedup_ttl)
  if seq > state_seq then
    redis.call('SET', state_key, event, 'EX', state_ttl)
  end
  if size + redis.call('ZADD', history_key, seq, event) > maxlen then
    redis.call('ZREMRANGEBYRANK', history_key, 0, -maxlen - 1)
  end
  redis.call('EXPIRE', history_key, history_ttl)
  local traceparent = per_entry == 5 and ARGV[a + 4] or ''
  if traceparent ~= '' then
    redis.call(publish, KEYS[k + 4], string.sub(event, 1, -2) .. ',"tp":"' .. traceparent .. '"}')
  else
    redis.call(publish, KEYS[k + 4], event)
  end
  redis.call('SET', dedup_key, 1, 'EX', dedup_ttl)
  return 1, true
end

local replies, acks = {}, {}
for i = 0, entries - 1 do
  local a = 7 + per_entry * i
  local reply, ack = route(2 + 5 * i, a)
  replies[i + 1] = reply
  if ack then
    acks[#acks + 1] = ARGV[a + 3]
  end
end
if #acks > 0 then
  redis.call('XACK', KEYS[1], ARGV[2], unpack(acks))
end
return replies
