-- WITHDRAW: KEYS are writers' intents, ARGV[1] the acquisition's id.
for _, intents in ipairs(KEYS) do
  withdraw_intent(intents, ARGV[1])
end
return 0
