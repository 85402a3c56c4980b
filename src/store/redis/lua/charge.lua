-- Charge (`Store::apply`): the batch is decided, then charged all or nothing. When every record
-- is admitted, each one's chosen candidate is charged (a record in check mode only reports);
-- otherwise nothing is, the admitted records report what their charge would leave, and a record
-- its own rule denied may offend (decide.lua).
local all = decide()
for _, rec in ipairs(records) do
  if all then
    if rec.mode ~= 1 then
      local p = rec.c[rec.chosen]
      local s, aux = p.alg.commit(p, p.state, now, rec.cost)
      rec.aux_out = aux
      -- The state a bucket's, pool's or window's charge found, for an exact undo.
      if p.code <= 2 or p.code == 5 then rec.found = p.state end
      save(p, s)
    end
  elseif rec.res[1] ~= 2 then
    -- All or nothing: report what the admitted charge leaves, uncharged.
    rec.res = uncharged(rec.c[rec.chosen])
  else
    offend(rec)
  end
  answer(rec, rec.res)
end
return finish()
