-- L1: publish one event of a job exactly once, in seq order.
--
-- KEYS[1] dedup key       {d:s}:published:<job_id>:<stage>:<seq>  (string)
-- KEYS[2] last seq key    {d:s}:published-seq:<job_id>   (string: the job's last published seq)
-- KEYS[3] state key       {d:s}:state:<job_id>           (string: latest event JSON)
-- KEYS[4] stream key      {d:s}:events                   (stream)
-- ARGV[1] seq             integer > 0
-- ARGV[2] stream maxlen   XADD MAXLEN ~
-- ARGV[3] dedup ttl       seconds, also the last seq key's
-- ARGV[4] state ttl       seconds
-- ARGV[5] job_id
-- ARGV[6] domain
-- ARGV[7] stage
-- ARGV[8] data            JSON text
-- ARGV[9] event head      the event JSON up to its data; prev_seq and the stream id are
--                         appended (as eventbus.bus.events.event_json does)
-- ARGV[10] batch previous the seq of the job's event just before this one in the same batch
--                         ("" or absent when none)
-- ARGV[11] traceparent    the publish's W3C trace context (exactly_once.tracing), kept as the
--                         entry's `tp` field for the router; absent when tracing is off
--
-- Returns 1 published, 0 duplicate. Error replies, each with nothing written:
--   "OUTOFORDER <last seq>"  seq is not above the job's last published seq (an earlier event
--                            after a later one: refused, not dropped);
--   "CORRUPT <key> ..."      a key holds the wrong type, or the last seq key no seq;
--   "BLOCKED ..."            the batch's previous event of the job was not published (it failed):
--                            this one would step over it, and it could never be published after.
--
-- Every check and read comes before the first write: Redis keeps what a script wrote before an
-- error, so a script that failed half-way would leave a partial event (a dedup key without its
-- entry: the retry is dropped as a duplicate).
-- wrong_type(key, expected): eventbus/bus/lua/_prelude.lua, prepended when loaded.
local corrupt = wrong_type(KEYS[1], 'string') or wrong_type(KEYS[2], 'string')
  or wrong_type(KEYS[3], 'string') or wrong_type(KEYS[4], 'stream')
if corrupt then
  return corrupt
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local seq = tonumber(ARGV[1])
local raw_last = redis.call('GET', KEYS[2])
local last = tonumber(raw_last or '0')
if not last then
  return redis.error_reply(
    'CORRUPT ' .. KEYS[2] .. ' holds ' .. string.format('%q', raw_last:sub(1, 40)) .. ', not a seq')
end
if ARGV[10] and ARGV[10] ~= '' and last < tonumber(ARGV[10]) then
  return redis.error_reply(
    'BLOCKED the previous event of the batch, seq ' .. ARGV[10] .. ', was not published')
end
if seq <= last then
  return redis.error_reply('OUTOFORDER ' .. last)
end
local id
if ARGV[11] then
  id = redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[2], '*',
    'job_id', ARGV[5], 'domain', ARGV[6], 'stage', ARGV[7],
    'seq', ARGV[1], 'prev_seq', tostring(last), 'data', ARGV[8], 'tp', ARGV[11])
else
  id = redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[2], '*',
    'job_id', ARGV[5], 'domain', ARGV[6], 'stage', ARGV[7],
    'seq', ARGV[1], 'prev_seq', tostring(last), 'data', ARGV[8])
end
redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[3])
redis.call('SET', KEYS[3], ARGV[9] .. ',"prev_seq":' .. last .. ',"stream_id":"' .. id .. '"}', 'EX', ARGV[4])
redis.call('SET', KEYS[1], id, 'EX', ARGV[3])
return 1
