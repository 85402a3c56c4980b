-- Giving back, for the refund and the undo: every record read (no penalty: blocks are only read
-- when deciding), and the candidate units go back to.

local records = {}
for r = 1, count do records[r] = read_record() end

-- The record's candidate with the fewest units left (a sharded refund goes there), with its
-- stored state (nil when the key holds none) and its state now.
local function fewest_left(rec)
  rec.chosen = 1
  for j, p in ipairs(rec.c) do
    p.stored = load(p)
    p.state = p.stored or p.alg.fresh(p, now)
    local _, _, _, remaining = p.alg.eval(p, p.state, now, 0, 1)
    p.remaining = remaining
    if remaining < rec.c[rec.chosen].remaining then rec.chosen = j end
  end
  return rec.c[rec.chosen]
end
