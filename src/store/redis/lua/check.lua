-- Check: the batch is decided and nothing is charged; admitted records report what they have
-- left. A record its own rule denies still offends under a penalty, as in a charge: a cross-slot
-- batch checks its later slots after a denial (src/store/redis/mod.rs, `cross_slot`), and a rule
-- denied there offends as it would in one step.
decide()
for _, rec in ipairs(records) do
  if rec.res[1] ~= 2 then
    rec.res = uncharged(rec.c[rec.chosen])
  else
    offend(rec)
  end
  answer(rec, rec.res)
end
return finish()
