-- Prepended to every script of eventbus/bus/lua/ when it is loaded (eventbus/bus/scripts.py): what all
-- of them check before they write.
--
-- wrong_type(key, expected): an error reply "CORRUPT <key> holds a <type>, not a <expected>"
-- when the key exists with another type, else nil. A script checks all its keys first: Redis
-- keeps what a script wrote before an error.
local function wrong_type(key, expected)
  local found = redis.call('TYPE', key)['ok']
  if found ~= expected and found ~= 'none' then
    return redis.error_reply('CORRUPT ' .. key .. ' holds a ' .. found .. ', not a ' .. expected)
  end
end

