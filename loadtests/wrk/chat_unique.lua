-- wrk script: a chat completion whose prompt is different on every request.
--
--   wrk -t1 -c32 -d10s -s loadtests/wrk/chat_unique.lua http://127.0.0.1:8080 -- RUN_ID
--
-- The prompt carries "<run id>-<thread>-<counter>", so every request is a cache miss; pass a
-- fresh RUN_ID (any string) per wrk invocation so a second run does not hit the entries the
-- first one stored (without it, the start time and a random number are used). The body is
-- otherwise the same as chat.lua, including temperature = 0 (cacheable in "deterministic" mode).

wrk.method = "POST"
wrk.path = "/v1/chat/completions"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer sk-bench"

local threads = {}
local thread_count = 0

-- main Lua state: give every thread its own id so counters never collide across threads
function setup(thread)
    thread_count = thread_count + 1
    thread:set("thread_id", thread_count)
    table.insert(threads, thread)
end

local prefix
local counter = 0

function init(args)
    local run_id = args[1]
    if run_id == nil or run_id == "" then
        math.randomseed(os.time())
        run_id = os.time() .. "." .. math.random(1, 1000000000)
    end
    prefix = run_id .. "-" .. tostring(thread_id or 0) .. "-"
end

local head = '{"model":"gpt-4o-mini","temperature":0,"max_tokens":32,'
    .. '"messages":[{"role":"system","content":"You are a terse assistant."},'
    .. '{"role":"user","content":"Say hello in one short sentence. Request '
local tail = '."}]}'

function request()
    counter = counter + 1
    return wrk.format(nil, nil, nil, head .. prefix .. counter .. tail)
end
