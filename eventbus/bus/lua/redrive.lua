-- Re-add one dead letter to its shard stream and delete it from the dead-letter stream,
-- atomically: it is deleted only after (and together with) its re-add.
--
-- KEYS[1] stream key       {d:s}:events  (stream)
-- KEYS[2] dead-letter key  {d:s}:dead  (stream)
-- ARGV[1] dead letter id
-- ARGV[2] stream maxlen    XADD MAXLEN ~
-- ARGV[3..] the original entry's fields and values, in pairs
--
-- Returns the new stream id, or false when the dead letter is gone (another redrive took it).
-- An error reply "CORRUPT <key> ..." when a key holds the wrong type: nothing is written, the
-- dead letter stays.
--
-- Every check and read comes before the first write: Redis keeps what a script wrote before an
-- error.
-- wrong_type(key, expected): eventbus/bus/lua/_prelude.lua, prepended when loaded.
local corrupt = wrong_type(KEYS[1], 'stream') or wrong_type(KEYS[2], 'stream')
if corrupt then
  return corrupt
end
if #redis.call('XRANGE', KEYS[2], ARGV[1], ARGV[1]) == 0 then
  return false
end
local fields = {}
for i = 3, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', unpack(fields))
redis.call('XDEL', KEYS[2], ARGV[1])
return id
