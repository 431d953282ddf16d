"""The probe itself: plan the run, generate the answers and the user turns, perturb, vary."""
