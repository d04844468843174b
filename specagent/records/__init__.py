"""The files stages hand each other, written and read in one place each: trajectories
(`trajectories`), and the conversational rows trained on (`rows`)."""
