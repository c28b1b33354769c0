//! stepwise-model: the neural engine (work in progress; modules land as they are tested).
