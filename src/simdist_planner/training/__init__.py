"""Pretraining (Eq. 2): config, window sampling, augmentation, scaler fitting, train state,
DDP, the loop and the encoder stage."""
