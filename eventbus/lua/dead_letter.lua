-- Move one stream entry to the dead-letter stream of its shard and ACK it, atomically:
-- it is never both lost and acked, nor dead-lettered twice by two processes racing on it.
--
-- KEYS[1] stream key       {d:s}:events
-- KEYS[2] dead-letter key  {d:s}:dead
-- ARGV[1] group
-- ARGV[2] stream id        the original entry's id
-- ARGV[3] reason
-- ARGV[4] deliveries       how many times the entry was delivered ("" when unknown)
-- ARGV[5..] the original entry's fields and values, in pairs
--
-- Returns 1 dead-lettered, 0 when the entry was no longer pending (someone else settled it).
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 0 then
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
return 1
