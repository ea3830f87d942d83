-- workload.lua's requests at a pace: after each answer a connection waits a random
-- time around BENCH_PACE_MS before its next request, so that every proxy is offered
-- about the same load and latencies compare at that load (wrk's closed loop alone
-- runs each proxy as fast as it goes, and the faster one queues differently).
-- Random, so that the 64 connections do not fall into step and arrive in bursts.
-- BENCH_LUA: the path of workload.lua, whose requests and BENCHRESULT line are used.
dofile(os.getenv("BENCH_LUA") or error("BENCH_LUA is not set"))
local pace = tonumber(os.getenv("BENCH_PACE_MS") or "3")
function delay()
  return pace * (0.5 + math.random())
end
