namespace ddprun {}
