-- wrk script: the same small chat completion on every request.
--
--   wrk -t1 -c32 -d10s -s loadtests/wrk/chat.lua http://127.0.0.1:8080
--
-- The body never changes, so a response cache sees nothing but hits after the first request.
-- temperature = 0 makes it cacheable in [cache] mode = "deterministic" as well as "all".

wrk.method = "POST"
wrk.path = "/v1/chat/completions"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer sk-bench"
wrk.body = '{"model":"gpt-4o-mini","temperature":0,"max_tokens":32,'
    .. '"messages":[{"role":"system","content":"You are a terse assistant."},'
    .. '{"role":"user","content":"Say hello in one short sentence."}]}'
