"""Pretraining (Eq. 2): config, window sampling, augmentation, scaler fitting, EMA, train state, DDP, the loop and the encoder stage."""
