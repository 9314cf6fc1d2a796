-- L1: publish one event of a job exactly once, in seq order.
--
-- KEYS[1] dedup key       {d:s}:published:<job_id>:<stage>:<seq>
-- KEYS[2] last seq key    {d:s}:published-seq:<job_id>   (the job's last published seq)
-- KEYS[3] state key       {d:s}:state:<job_id>           (latest event JSON)
-- KEYS[4] stream key      {d:s}:events
-- ARGV[1] seq             integer > 0
-- ARGV[2] stream maxlen   XADD MAXLEN ~
-- ARGV[3] dedup ttl       seconds, also the last seq key's
-- ARGV[4] state ttl       seconds
-- ARGV[5] job_id
-- ARGV[6] domain
-- ARGV[7] stage
-- ARGV[8] data            JSON text
-- ARGV[9] event head      the event JSON up to its data; prev_seq and the stream id are
--                         appended (as eventbus.entries.event_json does)
--
-- Returns 1 published, 0 duplicate; an error reply "OUTOFORDER <last seq>" when seq is not
-- above the job's last published seq (an earlier event after a later one: refused, not dropped).
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local seq = tonumber(ARGV[1])
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
if seq <= last then
  return redis.error_reply('OUTOFORDER ' .. last)
end
local id = redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[2], '*',
  'job_id', ARGV[5], 'domain', ARGV[6], 'stage', ARGV[7],
  'seq', ARGV[1], 'prev_seq', tostring(last), 'data', ARGV[8])
redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[3])
redis.call('SET', KEYS[3], ARGV[9] .. ',"prev_seq":' .. last .. ',"stream_id":"' .. id .. '"}', 'EX', ARGV[4])
redis.call('SET', KEYS[1], id, 'EX', ARGV[3])
return 1
