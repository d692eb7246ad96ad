use super::Shared;
pub async fn drive(_shared: Shared) -> Result<(), String> {
    Ok(())
}
