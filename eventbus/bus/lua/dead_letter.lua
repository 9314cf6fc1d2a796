-- Move one stream entry to the dead-letter stream of its shard and ACK it, atomically:
-- it is never both lost and acked, nor dead-lettered twice by two processes racing on it.
--
-- KEYS[1] stream key       {d:s}:events  (stream)
-- KEYS[2] dead-letter key  {d:s}:dead  (stream)
-- ARGV[1] group
-- ARGV[2] stream id        the original entry's id
-- ARGV[3] reason
-- ARGV[4] deliveries       how many times the entry was delivered ("" when unknown)
-- ARGV[5..] the original entry's fields and values, in pairs
--
-- Returns 1 dead-lettered, 0 when the entry was no longer pending (someone else settled it).
-- An error reply "CORRUPT <key> ..." when a key holds the wrong type: nothing is written, the
-- entry stays pending.
--
-- Every check and read comes before the first write, and the dead letter is added before the
-- entry is acked: Redis keeps what a script wrote before an error, so an ACK followed by a
-- failing XADD would lose the entry.
-- wrong_type(key, expected): eventbus/bus/lua/_prelude.lua, prepended when loaded.
local corrupt = wrong_type(KEYS[1], 'stream') or wrong_type(KEYS[2], 'stream')
if corrupt then
  return corrupt
end
-- Still pending? NOGROUP (no stream or no group any more): nothing is pending, as XACK says.
local pending = redis.pcall('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if pending['err'] then
  if string.sub(pending['err'], 1, 8) == 'NOGROUP ' then
    return 0
  end
  return pending
end
if #pending == 0 then
  return 0
end
local fields = {}
for i = 5, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
fields[#fields + 1] = 'reason'
fields[#fields + 1] = ARGV[3]
fields[#fields + 1] = 'original_stream_id'
fields[#fields + 1] = ARGV[2]
fields[#fields + 1] = 'deliveries'
fields[#fields + 1] = ARGV[4]
redis.call('XADD', KEYS[2], '*', unpack(fields))
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
return 1
