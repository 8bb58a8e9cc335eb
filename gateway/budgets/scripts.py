"""The Redis scripts of the limits (docs/spec.md §12, §20): gateway/budgets/reservations.py's
table of a reservation's states, and the GCRA buckets of gateway/budgets/limits.py, written in Lua
so that Redis applies each operation atomically, on its own clock, at most once per request id.

Each script reads and writes only keys of one hash tag (a tenant's), so they run on Redis
Cluster too; :class:`gateway.budgets.redis_limits.RedisLimits` calls them (``EVALSHA``).
"""

from __future__ import annotations

from typing import Final

# What the scripts share: Redis's clock, UTC calendar periods (the integer arithmetic of
# gateway.budgets.spend.period_bounds), and a budget read into a table: its hash {s: period start,
# p: spent, r: reserved in this period, q: the previous period's start, o: its spent} and its
# sorted set of reservations, from which expired ones are swept (EXPIRE) as it is read.
# Amounts are nano-USD integers (Lua numbers are doubles: exact far beyond these magnitudes).
_PRELUDE: Final = """
local t = redis.call('TIME')
local now_s = tonumber(t[1])
local now = now_s * 1000000 + tonumber(t[2])
local window = 60000000
local ttl = tonumber(ARGV[1])
local function fmt(v) return string.format('%.0f', v) end
local function from_civil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local mp = m > 2 and m - 3 or m + 9
  local doy = math.floor((153 * mp + 2) / 5) + d - 1
  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
  return era * 146097 + doe - 719468
end
local function bounds(code)
  if code == 0 then return 0, 0 end
  local days = math.floor(now_s / 86400)
  if code == 1 then return days * 86400, (days + 1) * 86400 end
  if code == 2 then
    local monday = days - (days + 3) % 7
    return monday * 86400, (monday + 7) * 86400
  end
  local z = days + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
    - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400
  if m <= 2 then y = y + 1 end
  local start = from_civil(y, m, 1)
  if m == 12 then y, m = y + 1, 1 else m = m + 1 end
  return start * 86400, from_civil(y, m, 1) * 86400
end
local function load(key, zkey, code)
  local h = redis.call('HMGET', key, 's', 'p', 'r', 'q', 'o', 'u')
  local start, reset = bounds(code)
  local b = {key = key, z = zkey, start = start, reset = reset,
    spent = tonumber(h[2]) or 0, reserved = tonumber(h[3]) or 0,
    pstart = tonumber(h[4]) or -1, pspent = tonumber(h[5]) or 0}
  local s = tonumber(h[1])
  if h[6] then  -- written by the release before reservations had leases: its sum is dropped
    b.reserved = 0
    redis.call('HDEL', key, 'u')
  end
  if s ~= start then
    if s then b.pstart, b.pspent = s, b.spent end
    b.spent, b.reserved = 0, 0
  end
  local gone = redis.call('ZRANGEBYSCORE', zkey, '-inf', now_s, 'LIMIT', 0, 512)
  for _, m in ipairs(gone) do
    local c, st = string.match(m, '|(%d+)|(%d+)$')
    if tonumber(st) == start then b.reserved = b.reserved - tonumber(c) end
    redis.call('ZREM', zkey, m)
  end
  return b
end
local function save(b)
  redis.call('HSET', b.key, 's', b.start, 'p', fmt(b.spent), 'r', fmt(b.reserved),
    'q', b.pstart, 'o', fmt(b.pspent))
  if b.reset > 0 then redis.call('EXPIREAT', b.key, b.reset + 86400) end
end
local function pack(out)
  for i, v in ipairs(out) do out[i] = fmt(v) end
  return table.concat(out, ' ')
end
"""

# The admission (check_gcra + budget_refusal, then the reservation), atomically and at most
# once per request id. KEYS: requests tat, tokens tat, key budget, tenant budget, their sorted
# sets of reservations, the request's record. ARGV: reservation ttl (s), rpm, tpm (0 = none),
# tokens, cost, key limit, key period code (-1 = no budget), tenant limit, tenant period code,
# the request's id ('' = nothing to record), record ttl (s).
# Returns, space-separated in one string: allowed, retry_us, remaining_requests (-1 none),
# remaining_tokens (-1 none), reset_requests_us, reset_tokens_us, refused_by (0 none,
# 1 requests, 2 tokens, 3 key budget, 4 tenant budget), now_s, key start, spent, reserved,
# tenant start, spent, reserved (the budgets as they were before this request), and 1 when the
# request had been admitted or settled before (nothing was done again).
ADMIT_LUA: Final = (
    _PRELUDE
    + """
local rpm, tpm = tonumber(ARGV[2]), tonumber(ARGV[3])
local tokens, cost = tonumber(ARGV[4]), tonumber(ARGV[5])
local klim, kcode = tonumber(ARGV[6]), tonumber(ARGV[7])
local tlim, tcode = tonumber(ARGV[8]), tonumber(ARGV[9])
local rid = ARGV[10]
local kb, tb = nil, nil
local by, retry = 0, 0
if kcode >= 0 then
  kb = load(KEYS[3], KEYS[5], kcode)
  if kb.spent + kb.reserved + cost > klim then by = 3 end
end
if tcode >= 0 then
  tb = load(KEYS[4], KEYS[6], tcode)
  if by == 0 and tb.spent + tb.reserved + cost > tlim then by = 4 end
end
local function view(b)
  if b then return b.start, b.spent, b.reserved end
  return 0, 0, 0
end
local ks, kp, kr = view(kb)
local ts, tp, tr = view(tb)
if rid ~= '' and redis.call('EXISTS', KEYS[7]) == 1 then
  for _, b in ipairs({kb, tb}) do if b then save(b) end end
  return pack({1, 0, -1, -1, 0, 0, 0, now_s, ks, kp, kr, ts, tp, tr, 1})
end
local rem_t, reset_t, t_tat, per_t = -1, 0, now, 0
if tpm > 0 then
  per_t = window / tpm
  t_tat = tonumber(redis.call('GET', KEYS[2]) or now)
  local used = math.max(t_tat - now, 0)
  rem_t = math.max(math.floor((window - used) / per_t), 0)
  if by == 0 and (used >= window or used + tokens * per_t > window + 1) then
    by = 2
    retry = math.ceil(used + math.max(tokens, 1) * per_t - window)
  else
    reset_t = math.ceil(used)
  end
end
local rem_r, reset_r, r_new = -1, 0, nil
if rpm > 0 and by == 0 then
  local per = window / rpm
  local tat = tonumber(redis.call('GET', KEYS[1]) or now)
  local new = math.max(tat, now) + per
  local used = new - now
  if used > window + 1 then
    by, retry, rem_r, reset_r = 1, math.ceil(used - window), 0, math.ceil(used - per)
  else
    r_new = new
    rem_r = math.floor((window - used) / per + 0.000001)
    reset_r = math.ceil(used)
  end
end
if by == 0 then
  if r_new then
    redis.call('SET', KEYS[1], fmt(r_new), 'PX', math.ceil((r_new - now) / 1000) + 1000)
  end
  if tokens > 0 and tpm > 0 then
    local new = math.max(t_tat, now) + tokens * per_t
    redis.call('SET', KEYS[2], fmt(new), 'PX', math.ceil((new - now) / 1000) + 1000)
  end
  if cost > 0 then
    for _, b in ipairs({kb, tb}) do
      if b then
        b.reserved = b.reserved + cost
        redis.call('ZADD', b.z, now_s + ttl, rid .. '|' .. fmt(cost) .. '|' .. fmt(b.start))
      end
    end
  end
  if rid ~= '' and (cost > 0 or tokens > 0) then
    redis.call('HSET', KEYS[7], 'st', 'r', 'c', fmt(cost), 't', fmt(tokens), 'ks', ks, 'ts', ts)
    redis.call('EXPIRE', KEYS[7], tonumber(ARGV[11]))
  end
end
for _, b in ipairs({kb, tb}) do if b then save(b) end end
return pack({by == 0 and 1 or 0, retry, rem_r, rem_t, reset_r, reset_t, by, now_s,
  ks, kp, kr, ts, tp, tr, 0})
"""
)

# The end of a request, at most once per request id. KEYS as for the admission. ARGV:
# reservation ttl, tpm, tokens used, cost, key period code (-1 none), tenant period code, the
# request's id, record ttl, and the period the key's and the tenant's budget admitted it in where
# the caller counted it itself (-1: unknown; used only when Redis has no record of it).
# Returns "now_s key_start key_spent tenant_start tenant_spent again".
SETTLE_LUA: Final = (
    _PRELUDE
    + """
local tpm, used, cost = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local rid = ARGV[7]
local rec = redis.call('HMGET', KEYS[7], 'st', 'c', 't', 'ks', 'ts')
local out = {now_s, 0, 0, 0, 0, 0}
local again = rec[1] == 's'
local held = rec[1] == 'r'
local rc, rt = tonumber(rec[2]) or 0, tonumber(rec[3]) or 0
local delta = used - (held and rt or 0)
if not again and tpm > 0 and delta ~= 0 then
  local per = window / tpm
  local cur = redis.call('GET', KEYS[2])
  local new = nil
  if delta > 0 then
    new = math.max(tonumber(cur or now), now) + delta * per
  elseif cur then
    new = tonumber(cur) + delta * per
  end
  if new and new > now then
    redis.call('SET', KEYS[2], fmt(new), 'PX', math.ceil((new - now) / 1000) + 1000)
  elseif new then
    redis.call('DEL', KEYS[2])
  end
end
for i = 0, 1 do
  local code = tonumber(ARGV[5 + i])
  if code >= 0 then
    local b = load(KEYS[3 + i], KEYS[5 + i], code)
    if not again then
      local told = tonumber(ARGV[9 + i])
      local made = held and tonumber(rec[4 + i]) or (told >= 0 and told) or b.start
      if held and rc > 0 then
        local m = rid .. '|' .. fmt(rc) .. '|' .. fmt(made)
        if redis.call('ZREM', b.z, m) == 1 and made == b.start then
          b.reserved = b.reserved - rc
        end
      end
      if made == b.pstart and made ~= b.start then
        b.pspent = b.pspent + cost
      else
        b.spent = b.spent + cost
      end
    end
    save(b)
    out[2 + 2 * i], out[3 + 2 * i] = b.start, b.spent
  end
end
if rid ~= '' then
  redis.call('HSET', KEYS[7], 'st', 's')
  redis.call('EXPIRE', KEYS[7], tonumber(ARGV[8]))
end
out[6] = again and 1 or 0
return pack(out)
"""
)

# A reservation made by this replica while Redis could not answer, counted in Redis (HOLD):
# never refused, at most once per request id. KEYS as for the admission. ARGV: reservation ttl,
# tpm, tokens, cost, key period code (-1 none), tenant period code, the request's id, record
# ttl, and the period the key's and the tenant's budget admitted it in here (-1: the current
# one). A request admitted in a period that is over holds nothing in the current one (its
# settlement is booked to its own). Returns "again key_start tenant_start cost": what the
# request's record says (again = 1: it had one already, nothing was done).
HOLD_LUA: Final = (
    _PRELUDE
    + """
local tpm, tokens, cost = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local rid = ARGV[7]
local rec = redis.call('HMGET', KEYS[7], 'st', 'c', 'ks', 'ts')
if rec[1] then
  return pack({1, tonumber(rec[3]) or 0, tonumber(rec[4]) or 0, tonumber(rec[2]) or 0})
end
local made = {0, 0}
for i = 0, 1 do
  local code = tonumber(ARGV[5 + i])
  if code >= 0 then
    local b = load(KEYS[3 + i], KEYS[5 + i], code)
    local m = tonumber(ARGV[9 + i])
    if m < 0 then m = b.start end
    if cost > 0 and m == b.start then
      b.reserved = b.reserved + cost
      redis.call('ZADD', b.z, now_s + ttl, rid .. '|' .. fmt(cost) .. '|' .. fmt(m))
    end
    save(b)
    made[i + 1] = m
  end
end
if tpm > 0 and tokens > 0 then
  local new = math.max(tonumber(redis.call('GET', KEYS[2]) or now), now) + tokens * window / tpm
  redis.call('SET', KEYS[2], fmt(new), 'PX', math.ceil((new - now) / 1000) + 1000)
end
if cost > 0 or tokens > 0 then  -- as the admission: nothing held, no record
  redis.call('HSET', KEYS[7], 'st', 'r', 'c', fmt(cost), 't', fmt(tokens), 'ks', made[1],
    'ts', made[2])
  redis.call('EXPIRE', KEYS[7], tonumber(ARGV[8]))
end
return pack({0, made[1], made[2], cost})
"""
)

# A live request's lease renewed: KEYS the budgets' sorted sets, ARGV reservation ttl, then each
# set's member ('' = none). Returns how many were still held.
RENEW_LUA: Final = (
    _PRELUDE
    + """
local n = 0
for i, z in ipairs(KEYS) do
  local m = ARGV[i + 1]
  if m ~= '' then
    n = n + redis.call('ZADD', z, 'XX', 'CH', now_s + ttl, m)
  end
end
return n
"""
)

# The budgets as they are now (expired reservations swept): KEYS pairs of (budget, its sorted
# set); ARGV reservation ttl, then each budget's period code. Returns "start spent reserved" per
# budget, space-separated.
REPORT_LUA: Final = (
    _PRELUDE
    + """
local out = {}
for i = 1, #KEYS, 2 do
  local b = load(KEYS[i], KEYS[i + 1], tonumber(ARGV[(i + 1) / 2 + 1]))
  save(b)
  out[#out + 1] = b.start
  out[#out + 1] = b.spent
  out[#out + 1] = math.max(b.reserved, 0)
end
return pack(out)
"""
)


__all__ = ["ADMIT_LUA", "HOLD_LUA", "RENEW_LUA", "REPORT_LUA", "SETTLE_LUA"]
